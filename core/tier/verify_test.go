package tier_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/tcpdata"
	"github.com/peerkv/peerkv/core/tier"
)

// dataPaths builds the data paths a test can run in one process; the
// same-host path refuses its own process, so TestVerifiedShmPull runs the
// producer in a child. NIXL needs its library: its completion is the same
// transfer_done, so the same check covers it.
var dataPaths = map[string]func(t testing.TB, cfg config.Config, region data.Region, guard data.WriteGuard) data.Transport{
	"mem": nil, // the cluster's memdata hub
	"tcp": func(t testing.TB, cfg config.Config, region data.Region, guard data.WriteGuard) data.Transport {
		tr, err := tcpdata.New(tcpdata.Options{LocalID: cfg.LocalID(), Region: region, Guard: guard,
			ListenHost: "127.0.0.1", RequireGrant: true, IOTimeout: cfg.LoadTimeout})
		require.NoError(t, err)
		return tr
	},
}

// sharedRegion is file-backed, as vLLM's is, so the same-host path can
// grant it.
func sharedRegion(t testing.TB) data.Region {
	fd, err := unix.MemfdCreate("peerkv-verify-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	const size = numRows * rowLen
	require.NoError(t, unix.Ftruncate(fd, size))
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(mem); _ = unix.Close(fd) })
	return data.Region{Mem: mem, RowLen: rowLen}
}

// pathNode is a node whose rows travel on the named path.
func (c *cluster) pathNode(path string, n int, mutate ...func(*config.Config)) *node {
	build := dataPaths[path]
	if build == nil {
		return c.node(n, mutate...)
	}
	return c.builtPeer(build, n, mutate...)
}

// builtPeer is a peer whose data paths build makes.
func (c *cluster) builtPeer(build func(testing.TB, config.Config, data.Region, data.WriteGuard) data.Transport,
	n int, mutate ...func(*config.Config)) *node {
	cfg := fastConfig(n)
	for _, m := range mutate {
		m(&cfg)
	}
	region := sharedRegion(c.t)
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: c.ctl.Transport(cfg.LocalID()),
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return build(c.t, cfg, region, guard), nil
		},
	})
	require.NoError(c.t, err)
	tr.WaitForTheLock() // single calls' answers are asserted (hostgate.go)
	c.t.Cleanup(func() { _ = tr.Shutdown() })
	return &node{Tier: tr, t: c.t, id: cfg.LocalID(), region: region, seen: map[int64]tier.JobResult{}}
}

// pdPull stores ks on prod under kv and loads them into dec's rows 40...,
// returning the load's report.
func pdPull(t *testing.T, prod, dec *node, kv string, ks [][]byte) tier.JobResult {
	t.Helper()
	_, err := prod.StartRequest("p-"+kv, []byte(fmt.Sprintf(`{"remote_decoder":{"kv_request_id":%q}}`, kv)))
	require.NoError(t, err)
	src, dst := make([]int64, len(ks)), make([]int64, len(ks))
	for i, k := range ks {
		prod.fill(10+i, k)
		src[i], dst[i] = int64(10+i), int64(40+i)
	}
	require.NoError(t, prod.SubmitStore("p-"+kv, 100, ks, src))
	require.NoError(t, prod.FinishRequest("p-"+kv))
	_, err = dec.StartRequest("d-"+kv, pdParams(kv, prod))
	require.NoError(t, err)
	dec.lookup("d-"+kv, ks)
	require.NoError(t, dec.SubmitLoad("d-"+kv, 7, ks, dst))
	res := dec.waitJob(7, 10*time.Second)
	require.NoError(t, dec.FinishRequest("d-"+kv))
	return res
}

// A verified pull lands the rows; with corruption injected on each path,
// where the rows landed (before the check) or at the source after the
// producer took its sums and before the transfer ran, the load fails,
// counted by cause and path and logged with peer, kv id and row: no
// wrong byte is reported as a successful load.
func TestVerifiedPullsCatchCorruptionOnEveryPath(t *testing.T) {
	for path := range dataPaths {
		t.Run(path, func(t *testing.T) {
			t.Run("clean", func(t *testing.T) {
				c := newCluster(t)
				prod, dec := c.pathNode(path, 1), c.pathNode(path, 2)
				ks := keys(0, 1, 2)
				res := pdPull(t, prod, dec, "kv-clean", ks)
				require.True(t, res.Success, "logs: %s", dec.TakeLogs(1<<16))
				for i := range ks {
					assert.True(t, dec.rowEquals(40+i, prod, 10+i))
				}
				st := dec.Stats()
				assert.Zero(t, st.IntegrityFailures[tier.IntegrityMismatch])
				assert.Equal(t, int64(1), st.Paths[path].Loads)
				assert.Zero(t, dec.RowsReread(), "rows that landed through the row guard were summed as they landed")
			})
			t.Run("changed after it landed", func(t *testing.T) {
				// A late or repeated write of the peer's lands over a row
				// after the row's own landing was summed (here just
				// before the check): it goes through the row guard, as
				// every write of these paths does, and is caught.
				c := newCluster(t)
				prod, dec := c.pathNode(path, 1), c.pathNode(path, 2)
				dec.BeforeCheck(func(rows []uint64) {
					wrong := append([]byte(nil), dec.region.Row(rows[1])...)
					wrong[17] ^= 0x40
					require.True(t, dec.WriteAsPeer(prod.id, rows[1], wrong), "the row is still owed to the peer")
				})
				res := pdPull(t, prod, dec, "kv-landed", keys(0, 1, 2))
				assertCaught(t, dec, prod, res, path, "kv-landed", 41)
			})
			t.Run("source changed mid-transfer", func(t *testing.T) {
				c := newCluster(t)
				prod, dec := c.pathNode(path, 1), c.pathNode(path, 2)
				prod.BeforeSend(flipRow(prod.region, 12)) // key 2's row
				res := pdPull(t, prod, dec, "kv-source", keys(0, 1, 2))
				assertCaught(t, dec, prod, res, path, "kv-source", 42)
			})
		})
	}
}

// flipRow changes the last byte of the producer's row when a summed write
// passes it to the hook (between its sum's read and its send's).
func flipRow(region data.Region, row uint64) func(string, []uint64) {
	return func(_ string, src []uint64) {
		for _, r := range src {
			if r == row {
				region.Row(r)[rowLen-1] ^= 0x01
			}
		}
	}
}

// aroundTheGuard is a data path that says something may write into the
// region around the row guard, as one does once a peer claimed a same-host
// grant or with NIXL among the paths; it is TCP otherwise.
type aroundTheGuard struct{ *tcpdata.Transport }

func (aroundTheGuard) WritesUnguarded() bool { return true }

// A row that landed through the guard (its sum taken as it landed) and was
// then changed around the guard is caught where such a write is possible:
// the check reads every row again there instead of trusting landed sums.
func TestARowChangedAroundTheGuardIsCaughtWhereThatIsPossible(t *testing.T) {
	c := newCluster(t)
	prod := c.pathNode("tcp", 1)
	dec := c.builtPeer(func(t testing.TB, cfg config.Config, region data.Region, guard data.WriteGuard) data.Transport {
		return aroundTheGuard{dataPaths["tcp"](t, cfg, region, guard).(*tcpdata.Transport)}
	}, 2)
	dec.BeforeCheck(func(rows []uint64) { dec.region.Row(rows[1])[17] ^= 0x40 })
	res := pdPull(t, prod, dec, "kv-around", keys(0, 1, 2))
	assertCaught(t, dec, prod, res, "tcp", "kv-around", 41)
	assert.Equal(t, int64(3), dec.RowsReread())
}

func assertCaught(t *testing.T, dec, prod *node, res tier.JobResult, path, kv string, row int) {
	t.Helper()
	assert.False(t, res.Success, "a load whose rows fail their check must fail")
	st := dec.Stats()
	assert.Equal(t, int64(1), st.IntegrityFailures[tier.IntegrityMismatch])
	assert.Equal(t, int64(1), st.Paths[path].IntegrityFailures)
	assert.Zero(t, st.LoadsOK)
	logs := string(dec.TakeLogs(1 << 16))
	assert.Contains(t, logs, fmt.Sprintf("peer %s: kv_request_id=%s round=0: row %d", prod.id, kv, row))
	assert.Contains(t, logs, "does not match the checksum")
}

// Either side with verify_pulls off: nothing is checked and the wire is as
// before (no sums); the pull still lands.
func TestVerifyPullsOffOnEitherSideChecksNothing(t *testing.T) {
	off := func(c *config.Config) { c.NoVerifyPulls = true }
	for name, sides := range map[string][2][]func(*config.Config){
		"producer off": {{off}, nil},
		"consumer off": {nil, {off}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t)
			prod, dec := c.node(1, sides[0]...), c.node(2, sides[1]...)
			checked := false
			dec.BeforeCheck(func([]uint64) { checked = true })
			res := pdPull(t, prod, dec, "kv-off", keys(3, 4))
			require.True(t, res.Success)
			assert.False(t, checked, "no check without both sides offering it")
			assert.True(t, dec.rowEquals(40, prod, 10))
			assert.False(t, strings.Contains(string(dec.TakeLogs(1<<16)), "checksum"))
		})
	}
}

// Shutdown returns only once no check reads the region: the host may free
// it then.
func TestShutdownWaitsForTheChecksInFlight(t *testing.T) {
	c := newCluster(t)
	prod, dec := c.node(1), c.node(2)
	checking, release := make(chan struct{}), make(chan struct{})
	dec.BeforeCheck(func([]uint64) { close(checking); <-release })
	ks := keys(0, 1)
	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-sd"}}`))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 100, ks, []int64{10, 11}))
	_, err = dec.StartRequest("d", pdParams("kv-sd", prod))
	require.NoError(t, err)
	dec.lookup("d", ks)
	require.NoError(t, dec.SubmitLoad("d", 7, ks, []int64{40, 41}))
	select {
	case <-checking:
	case <-time.After(10 * time.Second):
		t.Fatal("the load was never checked")
	}
	done := make(chan error)
	go func() { done <- dec.Shutdown() }()
	select {
	case <-done:
		t.Fatal("Shutdown returned while a check was reading the region")
	case <-time.After(time.Second): // past its own goodbye grace (100 ms)
	}
	close(release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	assert.False(t, dec.waitJob(7, 5*time.Second).Success, "a load still being checked at shutdown fails")
}
