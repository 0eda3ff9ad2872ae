package tier_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
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
	"github.com/peerkv/peerkv/tests/hostsim"
)

const (
	rowLen  = 4096
	numRows = 64
	keyLen  = 36
)

type cluster struct {
	t    testing.TB
	ctl  *memctl.Hub
	data *memdata.Hub
}

func newCluster(t testing.TB) *cluster {
	return &cluster{t: t, ctl: memctl.NewHub(), data: memdata.NewHub()}
}

// node is one tier plus the host-side bookkeeping a test needs.
type node struct {
	*tier.Tier
	t      testing.TB
	id     string
	region data.Region
	seen   hostsim.Jobs // every job reported, to prove exactly-once
}

func fastConfig(id int) config.Config {
	return config.Config{
		Host: "127.0.0.1", Port: 6000 + id, HashSeed: "42", ConfigFingerprint: "0123456789abcdef",
		KeyLen: keyLen, DataTransport: "tcp",
		HandshakeTimeout: 2 * time.Second, LookupTimeout: 2 * time.Second, LoadTimeout: 2 * time.Second,
		AbortAckTimeout: time.Second, StoreTimeout: 5 * time.Second, UnboundStoreTimeout: 5 * time.Second,
		InboundLookupTimeout: time.Second, Tick: 5 * time.Millisecond, DrainTimeout: 5 * time.Second,
		ShutdownDrainTimeout: time.Second,
	}.WithDefaults()
}

func (c *cluster) node(n int, mutate ...func(*config.Config)) *node {
	cfg := fastConfig(n)
	for _, m := range mutate {
		m(&cfg)
	}
	region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
	id := cfg.LocalID()
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: c.ctl.Transport(id),
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return c.data.Transport(id, region, guard), nil
		},
	})
	require.NoError(c.t, err)
	tr.WaitForTheLock() // these tests assert single calls' answers; the gate's own are in hostgate_test.go
	p := &node{Tier: tr, t: c.t, id: id, region: region, seen: map[int64]tier.JobResult{}}
	c.t.Cleanup(func() { _ = tr.Shutdown() })
	return p
}

func key(i int) []byte {
	k := sha256.Sum256([]byte(fmt.Sprintf("block-%d", i)))
	return append(k[:], 0, 0, 0, 0)
}

// asking is req's part of a LookupMany asking ks, back to back as a host
// passes them.
func asking(req string, ks [][]byte) tier.RequestKeys {
	return tier.RequestKeys{ReqID: req, Keys: bytes.Join(ks, nil)}
}

func keys(idx ...int) [][]byte {
	out := make([][]byte, len(idx))
	for i, n := range idx {
		out[i] = key(n)
	}
	return out
}

// fill writes a pattern derived from the key into a row.
func (p *node) fill(row int, k []byte) {
	dst := p.region.Row(uint64(row))
	for off := 0; off < len(dst); off += 8 {
		binary.LittleEndian.PutUint64(dst[off:], uint64(off)^binary.LittleEndian.Uint64(k))
	}
}

func (p *node) rowEquals(row int, other *node, otherRow int) bool {
	return bytes.Equal(p.region.Row(uint64(row)), other.region.Row(uint64(otherRow)))
}

// collect gathers finished jobs, failing on any job reported twice.
func (p *node) collect() { require.NoError(p.t, p.seen.Collect(p.Tier)) }

// waitJob waits (bounded) for a job's single report.
func (p *node) waitJob(id int64, within time.Duration) tier.JobResult {
	r, err := p.seen.Wait(p.Tier, id, within, nil)
	require.NoError(p.t, err)
	return r
}

// serve plays the host's serve_external_requests: held is what the host
// has in its CPU tier (key -> row).
func (p *node) serve(held map[string]int, nextJob *int64) {
	_, err := hostsim.Serve(p.Tier, hostsim.Rows(held), hostsim.Count(nextJob))
	require.NoError(p.t, err)
}

func (p *node) lookup(req string, ks [][]byte) []tier.LookupResult {
	out := make([]tier.LookupResult, len(ks))
	require.NoError(p.t, p.Lookup(req, ks, out))
	return out
}

func pdParams(kv string, prod *node) []byte {
	return []byte(fmt.Sprintf(`{"remote_prefiller":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`,
		kv, prod.id[len("127.0.0.1:"):]))
}

func p2pParams(kv string, prod *node) []byte { return p2pParamsTo(kv, prod.id) }

// p2pParamsTo names a source by its id ("127.0.0.1:port").
func p2pParamsTo(kv, source string) []byte {
	return []byte(fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`,
		kv, source[len("127.0.0.1:"):]))
}

func assertQuiet(t *testing.T, nodes ...*node) {
	t.Helper()
	for _, p := range nodes {
		p.collect()
		require.Eventually(t, func() bool {
			s := p.Stats()
			return s.JobsInFlight == 0 && s.ExpectedRows == 0 && s.InboundActive == 0
		}, 3*time.Second, 5*time.Millisecond, "node %s still holds work: %+v", p.id, p.Stats())
	}
}

func TestPDPrefillerFirst(t *testing.T) {
	c := newCluster(t)
	prod, dec := c.node(1), c.node(2)
	ks := keys(0, 1, 2, 3)

	pol, err := prod.StartRequest("p-req", []byte(`{"remote_decoder":{"kv_request_id":"kv1"}}`))
	require.NoError(t, err)
	assert.Equal(t, tier.RequestLevel, pol, "a prefill producer must ask for every block")
	for i, k := range ks {
		prod.fill(10+i, k)
	}
	require.NoError(t, prod.SubmitStore("p-req", 100, ks, []int64{10, 11, 12, 13}))
	require.NoError(t, prod.FinishRequest("p-req"))

	_, err = dec.StartRequest("d-req", pdParams("kv1", prod))
	require.NoError(t, err)
	for _, r := range dec.lookup("d-req", ks) {
		assert.Equal(t, tier.Hit, r, "a PD decoder claims every key")
	}
	require.NoError(t, dec.SubmitLoad("d-req", 7, ks, []int64{40, 41, 42, 43}))

	res := dec.waitJob(7, 3*time.Second)
	require.True(t, res.Success)
	assert.True(t, res.IsLoad)
	assert.EqualValues(t, 4*rowLen, res.Bytes)
	for i := range ks {
		assert.True(t, dec.rowEquals(40+i, prod, 10+i), "row %d differs", 40+i)
	}
	assert.True(t, prod.waitJob(100, 3*time.Second).Success, "the store job is released once served")
	require.NoError(t, dec.FinishRequest("d-req"))
	assertQuiet(t, prod, dec)
}

func TestPDDecoderFirst(t *testing.T) {
	c := newCluster(t)
	prod, dec := c.node(1), c.node(2)
	ks := keys(5, 6, 7)
	_, err := dec.StartRequest("d", pdParams("kv2", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 1, ks, []int64{0, 1, 2}))
	time.Sleep(50 * time.Millisecond) // the fetch reaches the producer before any store

	_, err = prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv2"}}`))
	require.NoError(t, err)
	for i, k := range ks {
		prod.fill(20+i, k)
	}
	require.NoError(t, prod.SubmitStore("p", 9, ks[:2], []int64{20, 21}))
	require.NoError(t, prod.SubmitStore("p", 10, ks[2:], []int64{22}))
	require.True(t, dec.waitJob(1, 3*time.Second).Success)
	for i := range ks {
		assert.True(t, dec.rowEquals(i, prod, 20+i))
	}
	assert.True(t, prod.waitJob(9, time.Second).Success)
	assert.True(t, prod.waitJob(10, time.Second).Success)
	require.NoError(t, prod.FinishRequest("p"))
	require.NoError(t, dec.FinishRequest("d"))
	assertQuiet(t, prod, dec)
}

func TestPDProducerCannotSupplyFailsFast(t *testing.T) {
	c := newCluster(t)
	slow := func(cfg *config.Config) { cfg.LoadTimeout = 20 * time.Second }
	prod, dec := c.node(1, slow), c.node(2, slow)
	ks := keys(1, 2, 3)
	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv3"}}`))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 5, ks[:1], []int64{3}))
	require.NoError(t, prod.FinishRequest("p")) // stored only one of three blocks

	_, err = dec.StartRequest("d", pdParams("kv3", prod))
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, dec.SubmitLoad("d", 2, ks, []int64{7, 8, 9}))
	res := dec.waitJob(2, 10*time.Second)
	assert.False(t, res.Success)
	assert.Less(t, time.Since(start), 10*time.Second, "the decoder learns at once, not at its 20 s load timeout")
	assert.Equal(t, []tier.LookupResult{tier.Miss}, dec.lookup("d", ks[:1]), "a failed pull recomputes")
	prod.waitJob(5, time.Second)
	require.NoError(t, dec.FinishRequest("d"))
	assertQuiet(t, prod, dec)
}

func TestP2PPartialHits(t *testing.T) {
	c := newCluster(t)
	prod, cons := c.node(1), c.node(2)
	ks := keys(0, 1, 2, 3)
	// Key 3 is held too, but after key 2, which nobody has: vLLM loads a
	// contiguous prefix, so key 3 is not pulled.
	held := map[string]int{string(ks[0]): 30, string(ks[1]): 31, string(ks[3]): 32}
	prod.fill(30, ks[0])
	prod.fill(31, ks[1])
	prod.fill(32, ks[3])
	var pinJobs int64 = 1000

	_, err := cons.StartRequest("c", p2pParams("kv4", prod))
	require.NoError(t, err)
	var got []tier.LookupResult
	require.Eventually(t, func() bool {
		got = cons.lookup("c", ks)
		require.NoError(t, cons.OnScheduleEnd())
		prod.serve(held, &pinJobs)
		for _, r := range got {
			if r == tier.Retry {
				return false
			}
		}
		return true
	}, 3*time.Second, 5*time.Millisecond)
	assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Miss, tier.Miss}, got)

	require.NoError(t, cons.SubmitLoad("c", 1, ks[:2], []int64{5, 6}))
	require.True(t, cons.waitJob(1, 3*time.Second).Success)
	assert.True(t, cons.rowEquals(5, prod, 30))
	assert.True(t, cons.rowEquals(6, prod, 31))
	assert.True(t, prod.waitJob(1001, time.Second).Success, "the pin is released once served")
	require.NoError(t, cons.FinishRequest("c"))
	assertQuiet(t, prod, cons)
}

func TestP2PAllMissSendsTerminalFetchAndReleasesNothing(t *testing.T) {
	c := newCluster(t)
	prod, cons := c.node(1), c.node(2)
	ks := keys(8, 9)
	var pinJobs int64
	_, err := cons.StartRequest("c", p2pParams("kv5", prod))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r := cons.lookup("c", ks)
		require.NoError(t, cons.OnScheduleEnd())
		prod.serve(nil, &pinJobs)
		return r[0] == tier.Miss && r[1] == tier.Miss
	}, 3*time.Second, 5*time.Millisecond)
	require.NoError(t, cons.FinishRequest("c"))
	assertQuiet(t, prod, cons)
}

func TestRemoteDecoderPlusKVSource(t *testing.T) {
	c := newCluster(t)
	source, prefiller, decoder := c.node(1), c.node(2), c.node(3)
	ks := keys(0, 1, 2)
	source.fill(0, ks[0])
	var pinJobs int64 = 500
	params := fmt.Sprintf(`{"remote_decoder":{"kv_request_id":"pd-1"},"remote_kv_source":{"kv_request_id":"p2p-1","remote_host":"127.0.0.1","remote_port":%s}}`,
		source.id[len("127.0.0.1:"):])
	pol, err := prefiller.StartRequest("pre", []byte(params))
	require.NoError(t, err)
	assert.Equal(t, tier.RequestLevel, pol)

	// The prefiller pulls the cached prefix from the source...
	require.Eventually(t, func() bool {
		r := prefiller.lookup("pre", ks[:1])
		require.NoError(t, prefiller.OnScheduleEnd())
		source.serve(map[string]int{string(ks[0]): 0}, &pinJobs)
		return r[0] == tier.Hit
	}, 3*time.Second, 5*time.Millisecond)
	require.NoError(t, prefiller.SubmitLoad("pre", 1, ks[:1], []int64{10}))
	require.True(t, prefiller.waitJob(1, 3*time.Second).Success)
	// ...computes the rest, and serves all of it to the decoder.
	prefiller.fill(11, ks[1])
	prefiller.fill(12, ks[2])
	require.NoError(t, prefiller.SubmitStore("pre", 2, ks, []int64{10, 11, 12}))
	require.NoError(t, prefiller.FinishRequest("pre"))

	_, err = decoder.StartRequest("dec", pdParams("pd-1", prefiller))
	require.NoError(t, err)
	require.NoError(t, decoder.SubmitLoad("dec", 3, ks, []int64{20, 21, 22}))
	require.True(t, decoder.waitJob(3, 3*time.Second).Success)
	assert.True(t, decoder.rowEquals(20, source, 0), "the prefix came from the source, through the prefiller")
	assert.True(t, decoder.rowEquals(21, prefiller, 11))
	assert.True(t, decoder.rowEquals(22, prefiller, 12))
	require.NoError(t, decoder.FinishRequest("dec"))
	assertQuiet(t, source, prefiller, decoder)
}

func TestForbiddenCombinationsRejected(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	src := `{"kv_request_id":"x","remote_host":"127.0.0.1","remote_port":7000}`
	for name, params := range map[string]string{
		"prefiller+decoder":  `{"remote_prefiller":` + src + `,"remote_decoder":{"kv_request_id":"y"}}`,
		"prefiller+source":   `{"remote_prefiller":` + src + `,"remote_kv_source":` + src + `}`,
		"all three":          `{"remote_prefiller":` + src + `,"remote_kv_source":` + src + `,"remote_decoder":{"kv_request_id":"y"}}`,
		"port out of range":  `{"remote_kv_source":{"kv_request_id":"x","remote_host":"h","remote_port":70000}}`,
		"missing request id": `{"remote_decoder":{}}`,
	} {
		_, err := p.StartRequest("r-"+name, []byte(params))
		require.ErrorIs(t, err, tier.ErrBadParams, name)
		assert.Equal(t, []tier.LookupResult{tier.Miss}, p.lookup("r-"+name, keys(1)), "a rejected request does not pull")
	}
	_, err := p.StartRequest("ok", []byte(`{"remote_decoder":{"kv_request_id":"y"},"remote_kv_source":`+src+`}`))
	require.NoError(t, err)
}

func TestProducerVanishesMidLoad(t *testing.T) {
	c := newCluster(t)
	prod, dec := c.node(1), c.node(2)
	ks := keys(1, 2)
	_, err := dec.StartRequest("d", pdParams("kv6", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 1, ks, []int64{0, 1}))
	time.Sleep(50 * time.Millisecond)
	c.ctl.Kill(prod.id)
	start := time.Now()
	res := dec.waitJob(1, 5*time.Second)
	assert.False(t, res.Success)
	assert.Less(t, time.Since(start), 4*time.Second, "bounded by load + abort-ack timeouts")
	assert.Equal(t, []tier.LookupResult{tier.Miss}, dec.lookup("d", ks[:1]))
	require.NoError(t, dec.FinishRequest("d"))
	assertQuiet(t, dec)
}

func TestHandshakeRejections(t *testing.T) {
	for name, mutate := range map[string]func(*config.Config){
		"hash seed":   func(c *config.Config) { c.HashSeed = "other" },
		"fingerprint": func(c *config.Config) { c.ConfigFingerprint = "fedcba9876543210" },
		"auth":        func(c *config.Config) { c.AuthSecret = "s3cret" },
	} {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t)
			prod, cons := c.node(1, mutate), c.node(2)
			_, err := cons.StartRequest("c", p2pParams("kv7", prod))
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				r := cons.lookup("c", keys(1))
				_ = cons.OnScheduleEnd()
				return r[0] == tier.Miss
			}, 10*time.Second, 5*time.Millisecond, "an incompatible peer makes the request compute locally")
			assert.Contains(t, string(prod.TakeLogs(1<<16))+string(cons.TakeLogs(1<<16)), "rejecting peer")
			assertQuiet(t, cons)
		})
	}
}

func TestAuthenticatedPeers(t *testing.T) {
	c := newCluster(t)
	secret := func(cfg *config.Config) { cfg.AuthSecret = "s3cret" }
	prod, dec := c.node(1, secret), c.node(2, secret)
	ks := keys(4)
	prod.fill(0, ks[0])
	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv8"}}`))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 1, ks, []int64{0}))
	_, err = dec.StartRequest("d", pdParams("kv8", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 2, ks, []int64{3}))
	require.True(t, dec.waitJob(2, 3*time.Second).Success)
	assert.True(t, dec.rowEquals(3, prod, 0))
}

func TestBadInputChangesNothing(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	_, err := p.StartRequest("r", []byte(`{"remote_decoder":{"kv_request_id":"kv9"}}`))
	require.NoError(t, err)
	require.ErrorIs(t, p.SubmitStore("r", 1, keys(1), []int64{numRows}), tier.ErrInvalidArgument)
	require.ErrorIs(t, p.SubmitStore("r", 1, [][]byte{{1, 2, 3}}, []int64{0}), tier.ErrInvalidArgument)
	require.ErrorIs(t, p.SubmitLoad("r", 1, keys(1, 2), []int64{0}), tier.ErrInvalidArgument)
	require.NoError(t, p.SubmitStore("r", 1, keys(1), []int64{0}))
	require.ErrorIs(t, p.SubmitStore("r", 1, keys(2), []int64{1}), tier.ErrDuplicate)
	_, err = p.StartRequest("r", nil)
	require.ErrorIs(t, err, tier.ErrDuplicate)
	assert.Equal(t, 1, p.Stats().JobsInFlight, "only the valid job was taken")
}

func TestUnfetchedStoresExpire(t *testing.T) {
	c := newCluster(t)
	p := c.node(1, func(cfg *config.Config) { cfg.UnboundStoreTimeout = 100 * time.Millisecond })
	_, err := p.StartRequest("r", []byte(`{"remote_decoder":{"kv_request_id":"kv10"}}`))
	require.NoError(t, err)
	require.NoError(t, p.SubmitStore("r", 1, keys(1), []int64{0}))
	assert.False(t, p.waitJob(1, 2*time.Second).Success)
	require.NoError(t, p.SubmitStore("r", 2, keys(2), []int64{1}))
	assert.False(t, p.waitJob(2, time.Second).Success, "a late store for an expired id fails at once")
}

func TestShutdownReportsEveryJob(t *testing.T) {
	c := newCluster(t)
	prod, dec := c.node(1), c.node(2)
	_, err := dec.StartRequest("d", pdParams("kv11", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 1, keys(1), []int64{0}))
	_, err = prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"other"}}`))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 2, keys(2), []int64{0}))
	require.NoError(t, dec.Shutdown())
	require.NoError(t, prod.Shutdown())
	assert.False(t, dec.waitJob(1, time.Second).Success)
	assert.False(t, prod.waitJob(2, time.Second).Success)
	require.ErrorIs(t, dec.SubmitLoad("d", 3, keys(1), []int64{0}), tier.ErrClosed)
}

func TestStalledTransferTimesOutAndLateWritesAreRefused(t *testing.T) {
	c := newCluster(t)
	short := func(cfg *config.Config) {
		cfg.LoadTimeout = 200 * time.Millisecond
		cfg.AbortAckTimeout = 200 * time.Millisecond
	}
	prod, dec := c.node(1, short), c.node(2, short)
	ks := keys(1, 2)
	prod.fill(0, ks[0])
	prod.fill(1, ks[1])
	sentinel := bytes.Repeat([]byte{0xAB}, rowLen)
	copy(dec.region.Row(5), sentinel)
	copy(dec.region.Row(6), sentinel)
	const stall = 4 * time.Second
	c.data.SetDelay(stall)

	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv12"}}`))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 1, ks, []int64{0, 1}))
	_, err = dec.StartRequest("d", pdParams("kv12", prod))
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, dec.SubmitLoad("d", 2, ks, []int64{5, 6}))
	res := dec.waitJob(2, 3*time.Second)
	assert.False(t, res.Success)
	assert.Less(t, time.Since(start), 3*time.Second, "load timeout + abort-ack timeout bound the wait, not the stall")
	time.Sleep(stall - time.Since(start) + 300*time.Millisecond) // the stalled write lands now, after the load failed
	assert.Equal(t, sentinel, dec.region.Row(5), "a late write must not touch rows the host took back")
	assert.Equal(t, sentinel, dec.region.Row(6))
	prod.waitJob(1, 5*time.Second)
	require.NoError(t, dec.FinishRequest("d"))
	require.NoError(t, prod.FinishRequest("p"))
	assertQuiet(t, prod, dec)
}

func TestUnansweredLookupsBecomeMisses(t *testing.T) {
	c := newCluster(t)
	// The producer never serves its inbound lookups, and would answer them
	// itself only after 60 s: only the consumer's own deadline can fire.
	prod := c.node(1, func(cfg *config.Config) { cfg.InboundLookupTimeout = time.Minute })
	cons := c.node(2, func(cfg *config.Config) { cfg.LookupTimeout = 200 * time.Millisecond })
	_, err := cons.StartRequest("c", p2pParams("kv13", prod))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r := cons.lookup("c", keys(1))
		require.NoError(t, cons.OnScheduleEnd())
		return r[0] == tier.Miss
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, cons.FinishRequest("c"))
}

// A tier ticks only the sessions holding work: one that went quiet between
// requests must be ticked again once it takes on the next, or its deadlines
// never fire. Each case leaves exactly one side's deadline to answer.
func TestAQuietSessionKeepsItsDeadlinesForTheNextRequest(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prod, cons func(*config.Config)
		// served: the lookups the producer answered (lookup_served_s), each
		// at its 200 ms deadline; the consumer's deadline ends them unanswered.
		served int64
	}{
		{"the consumer's lookup deadline",
			func(cfg *config.Config) { cfg.InboundLookupTimeout = time.Minute },
			func(cfg *config.Config) { cfg.LookupTimeout = 200 * time.Millisecond }, 0},
		{"the producer's inbound lookup deadline",
			func(cfg *config.Config) { cfg.InboundLookupTimeout = 200 * time.Millisecond },
			func(cfg *config.Config) { cfg.LookupTimeout = time.Minute }, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			prod, cons := c.node(1, tc.prod), c.node(2, tc.cons)
			for i, kv := range []string{"kv-before", "kv-after"} {
				req := fmt.Sprintf("c%d", i)
				_, err := cons.StartRequest(req, p2pParams(kv, prod))
				require.NoError(t, err)
				start := time.Now()
				require.Eventually(t, func() bool {
					r := cons.lookup(req, keys(i))
					require.NoError(t, cons.OnScheduleEnd())
					return r[0] == tier.Miss
				}, 10*time.Second, 5*time.Millisecond, "request %d got no answer", i)
				assert.Less(t, time.Since(start), 5*time.Second, "answered by a deadline of a minute, not 200 ms")
				require.NoError(t, cons.FinishRequest(req))
				time.Sleep(100 * time.Millisecond) // many ticks: both sessions go quiet
			}
			served := prod.Stats().LookupServed
			assert.Equal(t, tc.served, histogramCount(served))
			assert.GreaterOrEqual(t, histogramSum(served), float64(tc.served)*0.2)
		})
	}
}
