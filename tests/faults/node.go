package faults

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control/memctl"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/memdata"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/hostsim"
)

// Layout every node of the suite shares.
const (
	RowLen      = 4096
	HashSeed    = "42"
	Fingerprint = "0123456789abcdef"
)

// Config is a node's configuration with the suite's short deadlines.
func Config(port int) config.Config {
	return config.Config{
		Host: "127.0.0.1", Port: port, HashSeed: HashSeed, ConfigFingerprint: Fingerprint, KeyLen: KeyLen,
		DataTransport:    "tcp",
		HandshakeTimeout: 2 * time.Second, LookupTimeout: 2 * time.Second, LoadTimeout: 2 * time.Second,
		AbortAckTimeout: time.Second, StoreTimeout: 3 * time.Second, UnboundStoreTimeout: 3 * time.Second,
		InboundLookupTimeout: time.Second, Tick: 5 * time.Millisecond,
		DrainTimeout: 5 * time.Second, ShutdownDrainTimeout: time.Second,
	}.WithDefaults()
}

// Cluster is the in-memory network of one test (or of the soak run).
type Cluster struct {
	Ctl    *memctl.Hub
	Data   *memdata.Hub
	Ledger *Ledger
}

// NewCluster returns empty hubs and ledger.
func NewCluster() *Cluster {
	return &Cluster{Ctl: memctl.NewHub(), Data: memdata.NewHub(), Ledger: NewLedger()}
}

// Node is one tier behind a fault Wire, with what its host holds: the
// local side of a test ("peer" is always the remote one).
type Node struct {
	*tier.Tier
	ID     string
	Region data.Region
	Wire   *Wire
	ledger *Ledger

	mu   sync.Mutex
	held map[string]int64 // keys in the host's CPU tier -> row (it answers lookups from this)
	pins []int64          // pin jobs its serve passes submitted, oldest first
}

// Open starts a node at 127.0.0.1:port with rows rows; seed drives its
// Wire's random rules.
func (c *Cluster) Open(port, rows int, seed uint64, mutate ...func(*config.Config)) (*Node, error) {
	cfg := Config(port)
	for _, m := range mutate {
		m(&cfg)
	}
	region := data.Region{Mem: make([]byte, rows*RowLen), RowLen: RowLen}
	id := cfg.LocalID()
	w := Wrap(c.Ctl.Transport(id), seed)
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: w,
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return c.Data.Transport(id, region, guard), nil
		},
	})
	if err != nil {
		_ = w.Close()
		return nil, err
	}
	return &Node{Tier: tr, ID: id, Region: region, Wire: w, ledger: c.Ledger, held: map[string]int64{}}, nil
}

// Adopt wraps a tier opened elsewhere (a real node, as in tests/netns),
// recording its jobs in ledger; it has no Wire.
func Adopt(tr *tier.Tier, region data.Region, ledger *Ledger) *Node {
	return &Node{Tier: tr, ID: tr.LocalID(), Region: region, ledger: ledger, held: map[string]int64{}}
}

// Row returns row i of the node's region.
func (p *Node) Row(i int64) []byte { return p.Region.Row(uint64(i)) }

// Hold puts key in the host's CPU tier at row, filled with its pattern.
func (p *Node) Hold(key []byte, row int64) {
	Fill(p.Row(row), key)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held[string(key)] = row
}

// Evict drops key from the host's CPU tier; its row may be reused.
func (p *Node) Evict(key []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.held, string(key))
}

// Holds reports whether the host holds key.
func (p *Node) Holds(key []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.held[string(key)]
	return ok
}

// Pins returns the pin jobs the node's serve passes submitted.
func (p *Node) Pins() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.pins...)
}

// Collect moves the node's finished jobs into the ledger.
func (p *Node) Collect() { p.ledger.Collect(p.ID, p.Tier) }

// Submit records a job in the ledger; see Ledger.Submit.
func (p *Node) Submit(id int64, what string) { p.ledger.Submit(p.ID, id, what) }

// SubmitLoadJob submits a load job, recorded in the ledger.
func (p *Node) SubmitLoadJob(req string, job int64, keys [][]byte, slots []int64) error {
	p.Submit(job, "load "+req)
	if err := p.SubmitLoad(req, job, keys, slots); err != nil {
		p.ledger.Withdraw(job)
		return err
	}
	return nil
}

// SubmitStoreJob submits a store job, recorded in the ledger.
func (p *Node) SubmitStoreJob(req string, job int64, keys [][]byte, slots []int64) error {
	p.Submit(job, "store "+req)
	if err := p.SubmitStore(req, job, keys, slots); err != nil {
		p.ledger.Withdraw(job)
		return err
	}
	return nil
}

// Serve is one serve pass of the host: every inbound lookup answered from
// the keys it holds, hits pinned as one job per answer.
func (p *Node) Serve() error {
	_, err := hostsim.Serve(p.Tier, p.heldRow, nodePins{p})
	if err == nil || errors.Is(err, tier.ErrClosed) {
		return nil
	}
	return fmt.Errorf("%s: %w", p.ID, err)
}

func (p *Node) heldRow(key []byte, _ int) (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	row, ok := p.held[string(key)]
	return row, ok
}

// nodePins numbers a node's pin jobs from the suite's job ids, each
// recorded in the ledger (and withdrawn if the answer was refused).
type nodePins struct{ p *Node }

func (n nodePins) Next(req string) int64 {
	job := NextJob()
	n.p.Submit(job, "pin "+req)
	n.p.mu.Lock()
	n.p.pins = append(n.p.pins, job)
	n.p.mu.Unlock()
	return job
}

func (n nodePins) Refused(job int64) { n.p.ledger.Withdraw(job) }

// Quiet says what the node still holds ("" when it holds nothing a quiet
// node may not).
func (p *Node) Quiet() string {
	s := p.Stats()
	if s.JobsInFlight == 0 && s.ExpectedRows == 0 && s.ParkedStores == 0 && s.InboundActive == 0 {
		return ""
	}
	return fmt.Sprintf("%s: jobs_in_flight=%d expected_rows=%d parked_stores=%d inbound_active=%d",
		p.ID, s.JobsInFlight, s.ExpectedRows, s.ParkedStores, s.InboundActive)
}
