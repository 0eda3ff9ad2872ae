package tier_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	corenode "github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
)

// shmChildEnv makes this test binary a producer node on the same-host path:
// "<corrupt source: 0|1>". It stores keys(0,1,2) in rows 10.. under kv
// "kv-shm", prints "ready <port>" and serves until its stdin closes.
const shmChildEnv = "PEERKV_VERIFY_SHM_PRODUCER"

func init() {
	if mode, ok := os.LookupEnv(shmChildEnv); ok {
		if err := runShmProducer(mode == "1"); err != nil {
			fmt.Fprintln(os.Stderr, "shm producer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func shmNodeConfig(port int) (config.Config, error) {
	return config.FromJSON([]byte(fmt.Sprintf(`{"host":"127.0.0.1","port":%d,"data_port":0,"hash_seed":"42",
		"key_len":%d,"load_timeout_s":5,"shutdown_drain_timeout_s":0.5,"nixl_library":"/nonexistent/libnixl_capi.so"}`, port, keyLen)))
}

// freePort is a port on 127.0.0.1 free a moment ago (the kernel's pick).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func runShmProducer(corrupt bool) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	cfg, err := shmNodeConfig(port)
	if err != nil {
		return err
	}
	region := sharedRegion(&testing.T{})
	prod := &node{region: region}
	t, err := corenode.Open(cfg, region)
	if err != nil {
		return err
	}
	defer t.Shutdown()
	prod.Tier = t
	if corrupt {
		t.BeforeSend(flipRow(region, 12)) // key 2's row: the copy read it, its sum has not yet
	}
	ks := keys(0, 1, 2)
	if _, err := t.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-shm"}}`)); err != nil {
		return err
	}
	for i, k := range ks {
		prod.fill(10+i, k)
	}
	if err := t.SubmitStore("p", 100, ks, []int64{10, 11, 12}); err != nil {
		return err
	}
	if err := t.FinishRequest("p"); err != nil {
		return err
	}
	fmt.Printf("ready %s\n", t.LocalID()[strings.LastIndexByte(t.LocalID(), ':')+1:])
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// The same-host path (shm) between two processes: a clean verified pull
// lands; a row changed where it landed, or at the source after its sums,
// fails the load, counted under path "shm".
func TestVerifiedShmPull(t *testing.T) {
	for name, mode := range map[string]string{"clean": "0", "changed after it landed": "0", "source changed mid-transfer": "1"} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), shmChildEnv+"="+mode)
			cmd.Stderr = os.Stderr
			stdin, err := cmd.StdinPipe()
			require.NoError(t, err)
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
			lines := make(chan string, 1)
			go func() {
				line, _ := bufio.NewReader(stdout).ReadString('\n')
				lines <- line
			}()
			var port int
			select {
			case line := <-lines:
				port, err = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "ready ")))
				require.NoError(t, err, "producer said %q", line)
			case <-time.After(30 * time.Second):
				t.Fatal("the producer did not start")
			}

			myPort, err := freePort()
			require.NoError(t, err)
			cfg, err := shmNodeConfig(myPort)
			require.NoError(t, err)
			region := sharedRegion(t)
			tr, err := corenode.Open(cfg, region)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tr.Shutdown() })
			dec := &node{Tier: tr, t: t, id: tr.LocalID(), region: region, seen: map[int64]tier.JobResult{}}
			if name == "changed after it landed" {
				dec.BeforeCheck(func(rows []uint64) { region.Row(rows[1])[17] ^= 0x40 })
			}
			ks := keys(0, 1, 2)
			_, err = dec.StartRequest("d", []byte(fmt.Sprintf(
				`{"remote_prefiller":{"kv_request_id":"kv-shm","remote_host":"127.0.0.1","remote_port":%d}}`, port)))
			require.NoError(t, err)
			dec.lookup("d", ks)
			require.NoError(t, dec.SubmitLoad("d", 7, ks, []int64{40, 41, 42}))
			res := dec.waitJob(7, 20*time.Second)
			prodID := "127.0.0.1:" + strconv.Itoa(port)
			switch name {
			case "clean":
				require.True(t, res.Success, "logs: %s", dec.TakeLogs(1<<16))
				require.Equal(t, int64(1), dec.Stats().Paths["shm"].Loads, "the rows came over shm")
				require.Equal(t, int64(3), dec.RowsReread(),
					"a peer holding a same-host grant can write around the row guard: every row is read again")
			case "changed after it landed":
				assertCaught(t, dec, &node{id: prodID}, res, "shm", "kv-shm", 41)
			default:
				assertCaught(t, dec, &node{id: prodID}, res, "shm", "kv-shm", 42)
			}
		})
	}
}
