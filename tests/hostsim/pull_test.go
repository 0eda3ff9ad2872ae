package hostsim

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control/memctl"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/memdata"
	"github.com/peerkv/peerkv/core/tier"
)

const rowLen = 4096

type hubs struct {
	ctl  *memctl.Hub
	data *memdata.Hub
}

func (h hubs) open(t *testing.T, port int) (*tier.Tier, data.Region) {
	cfg := config.Config{
		Host: "127.0.0.1", Port: port, HashSeed: "42", ConfigFingerprint: "0123456789abcdef", KeyLen: 36,
		DataTransport: "tcp", Tick: 5 * time.Millisecond,
	}.WithDefaults()
	region := data.Region{Mem: make([]byte, 8*rowLen), RowLen: rowLen}
	id := cfg.LocalID()
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: h.ctl.Transport(id),
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return h.data.Transport(id, region, guard), nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Shutdown() })
	return tr, region
}

func key(i int) []byte { return []byte(fmt.Sprintf("key-%032d", i)) }

// A consumer host settles its lookups while the producer's host serves
// them, pulls the hits and sees its load and the producer's pin reported
// once each: the host's side of a P2P pull, all through hostsim.
func TestAHostPullsWhatItsPeersHostHolds(t *testing.T) {
	h := hubs{ctl: memctl.NewHub(), data: memdata.NewHub()}
	prod, prodRegion := h.open(t, 7001)
	cons, consRegion := h.open(t, 7002)
	copy(prodRegion.Row(3), bytes.Repeat([]byte{0xab}, rowLen))
	held := Rows(map[string]int{string(key(0)): 3})
	prodJobs, pinJobs := Jobs{}, int64(100)
	serve := func() {
		_, err := Serve(prod, held, Count(&pinJobs))
		require.NoError(t, err)
		require.NoError(t, prodJobs.Collect(prod))
	}

	params := fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":"kv1","remote_host":"127.0.0.1","remote_port":%d}}`, 7001)
	_, err := cons.StartRequest("r", []byte(params))
	require.NoError(t, err)
	got, err := Settle(cons, "r", [][]byte{key(0), key(1)}, 5*time.Second, serve)
	require.NoError(t, err)
	assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Miss}, got)

	require.NoError(t, cons.SubmitLoad("r", 1, [][]byte{key(0)}, []int64{5}))
	consJobs := Jobs{}
	res, err := consJobs.Wait(cons, 1, 5*time.Second, serve)
	require.NoError(t, err)
	require.True(t, res.Success)
	assert.Equal(t, prodRegion.Row(3), consRegion.Row(5))
	pin, err := prodJobs.Wait(prod, 101, 5*time.Second, nil)
	require.NoError(t, err)
	assert.True(t, pin.Success, "the pin is released once its rows were fetched")
	require.NoError(t, cons.FinishRequest("r"))
	assert.Len(t, consJobs, 1)
	assert.Len(t, prodJobs, 1)
}

func TestWaitFailsNamingTheJobOnceItsTimeHasPassed(t *testing.T) {
	h := hubs{ctl: memctl.NewHub(), data: memdata.NewHub()}
	tr, _ := h.open(t, 7003)
	_, err := Jobs{}.Wait(tr, 9, 20*time.Millisecond, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "job 9 not reported within 20ms")
}
