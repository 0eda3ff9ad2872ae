package node

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/hostsim"
)

// IPv6 end to end: real ZMQ control and TCP data over ::1, sources named by
// URL (tcp://[::1]:PORT), ids left to the consumer, the prompt pulled from
// two of them.

func ipv6Loopback(t *testing.T) {
	out, err := exec.Command("ip", "-6", "addr", "show", "lo").Output()
	if err != nil || !strings.Contains(string(out), "::1/128") {
		t.Skip("this machine has no ::1 on lo")
	}
}

func ipv6Config(t *testing.T) config.Config {
	ln, err := net.Listen("tcp", "[::1]:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	cfg, err := config.FromJSON([]byte(`{"host":"::1","port":` + strconv.Itoa(port) +
		`,"data_port":0,"data_transport":"tcp","key_len":36,"hash_seed":"v6","shutdown_drain_timeout_s":0.5}`))
	require.NoError(t, err)
	return cfg
}

func TestTwoSourcesOverIPv6ByURL(t *testing.T) {
	ipv6Loopback(t)
	const rows, rowLen, n = 48, 4096, 40
	key := func(i int) []byte { k := sha256.Sum256([]byte(fmt.Sprint("v6-", i))); return append(k[:], 0, 0, 0, 0) }
	open := func() (*tier.Tier, data.Region) {
		region := data.Region{Mem: make([]byte, rows*rowLen), RowLen: rowLen}
		tr, err := Open(ipv6Config(t), region)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Shutdown() })
		return tr, region
	}
	cons, consRegion := open()
	assert.True(t, strings.HasPrefix(cons.LocalID(), "[::1]:"), cons.LocalID())
	var srcs []*tier.Tier
	var srcRegions []data.Region
	var urls []string
	for s := range 2 {
		tr, region := open()
		for i := range n {
			copy(region.Row(uint64(i)), bytes.Repeat([]byte{byte(s + 1), byte(i)}, rowLen/2)) // whose row it is
		}
		srcs, srcRegions = append(srcs, tr), append(srcRegions, region)
		urls = append(urls, strconv.Quote("tcp://"+tr.LocalID()))
	}
	_, err := cons.StartRequest("r", []byte(`{"remote_kv_source":[`+strings.Join(urls, ",")+`]}`))
	require.NoError(t, err)

	keys, slots := make([][]byte, n), make([]int64, n)
	for i := range n {
		keys[i], slots[i] = key(i), int64(i)
	}
	held := map[string]int64{} // each source holds every key, in its row
	for i, k := range keys {
		held[string(k)] = slots[i]
	}
	pins := hostsim.Count(new(int64))
	serve := func() {
		for _, src := range srcs {
			_, err := hostsim.Serve(src, hostsim.Rows(held), pins)
			require.NoError(t, err)
			src.GetFinished(64)
		}
	}
	res := make([]tier.LookupResult, n)
	answered := func() bool { return srcs[0].Stats().InboundLookups > 0 && srcs[1].Stats().InboundLookups > 0 }
	require.Eventually(t, func() bool {
		require.NoError(t, cons.Lookup("r", keys, res))
		require.NoError(t, cons.OnScheduleEnd())
		serve()
		return answered() && !containsResult(res, tier.Retry)
	}, 10*time.Second, 2*time.Millisecond, "lookups over IPv6")
	time.Sleep(50 * time.Millisecond) // both answers in before the load spreads
	for i, r := range res {
		require.Equal(t, tier.Hit, r, "key %d", i)
	}
	require.NoError(t, cons.SubmitLoad("r", 1, keys, slots))
	jobs := hostsim.Jobs{}
	done, err := jobs.Wait(cons, 1, 10*time.Second, serve)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.True(t, done.Success)
	from := [2]int{}
	for i := range n {
		got := consRegion.Row(uint64(i))
		switch {
		case bytes.Equal(got, srcRegions[0].Row(uint64(i))):
			from[0]++
		case bytes.Equal(got, srcRegions[1].Row(uint64(i))):
			from[1]++
		default:
			t.Fatalf("row %d holds neither source's bytes", i)
		}
	}
	assert.Equal(t, [2]int{24, 16}, from, "0-15 and 32-39 from the first source, 16-31 from the second")
	require.NoError(t, cons.FinishRequest("r"))
	assert.EqualValues(t, 2, cons.Stats().KVIDsMinted)
}

func containsResult(rs []tier.LookupResult, want tier.LookupResult) bool {
	for _, r := range rs {
		if r == want {
			return true
		}
	}
	return false
}
