package tier

import (
	"time"

	"github.com/peerkv/peerkv/core/session"
)

// serveState is where a PD kv id this node serves as a prefiller stands.
type serveState int

const (
	// serveParked: stores wait for the decoder's fetch.
	serveParked serveState = iota
	// serveBound: one session fetches it; later stores go straight to it.
	serveBound
	// serveExpired: parked stores expired unfetched; later stores and
	// fetches fail at once until the tombstone is forgotten.
	serveExpired
)

// parked is a store batch no decoder fetched yet.
type parked struct {
	jobID int64
	keys  [][]byte
	rows  []uint64
}

// serveKV is one PD kv id this node serves: the one owner of what the
// prefill stored for it, which session may fetch it, and its deadline.
type serveKV struct {
	id    string
	state serveState
	s     *session.Session // serveBound
	// claimed: a local request serves this kv id (its remote_decoder).
	// A fetch for an unclaimed id waits for the prefill to start here.
	claimed     bool
	requestDone bool // the local request finished: nothing more is stored
	parked      []parked
	// deadline: serveParked with batches, when they expire; serveBound and
	// unclaimed, when the fetch stops waiting for a prefill; serveExpired,
	// when the tombstone is forgotten.
	deadline time.Time
}

func (d *serveDesk) servingKV(kv string) *serveKV {
	sk := d.serving[kv]
	if sk == nil {
		sk = &serveKV{id: kv}
		d.serving[kv] = sk
	}
	return sk
}

// claim records that a starting request serves kv.
func (d *serveDesk) claim(kv string) {
	d.servingKV(kv).claimed = true
}

// store hands a prefill's stored rows to the decoder, or parks them.
func (d *serveDesk) store(kv string, jobID int64, keys [][]byte, rows []uint64) {
	sk := d.servingKV(kv)
	switch {
	case sk.state == serveExpired:
		d.logf("WARNING", "store job %d for kv_request_id=%s, whose earlier stores expired unfetched; failing it", jobID, kv)
		d.report(jobID, false, 0)
	case sk.state == serveBound && !sk.s.Dead():
		sk.s.AddStoredBlocks(kv, keys, rows, jobID, 0, false)
	default:
		if sk.state != serveParked || len(sk.parked) == 0 {
			sk.deadline = d.now().Add(d.cfg.UnboundStoreTimeout)
		}
		sk.state, sk.s = serveParked, nil
		sk.parked = append(sk.parked, parked{jobID: jobID, keys: keys, rows: rows})
		d.parkedBatches++
	}
}

// fetchArrived binds kv to the first session that fetches it; any other
// session's fetch is refused, so nobody can take over a decoder's rows.
func (d *serveDesk) fetchArrived(s *session.Session, kv string) {
	sk := d.serving[kv]
	switch {
	case sk == nil:
		// The decoder asked before the prefill started here.
		d.serving[kv] = &serveKV{id: kv, state: serveBound, s: s, deadline: d.now().Add(d.cfg.UnboundStoreTimeout)}
		return
	case sk.state == serveExpired:
		s.FinishProducer(kv) // its stores are gone: fail the round now, not at the load timeout
		return
	case sk.state == serveBound && sk.s == s:
		return
	case sk.state == serveBound && !sk.s.Dead():
		d.logf("WARNING", "peer %s fetched kv_request_id=%s, which peer %s already fetches; refusing it",
			s.PeerID(), kv, sk.s.PeerID())
		s.FinishProducer(kv)
		return
	}
	sk.state, sk.s = serveBound, s
	batches := sk.parked
	sk.parked = nil
	d.parkedBatches -= len(batches)
	sk.deadline = d.now().Add(d.cfg.UnboundStoreTimeout)
	for _, b := range batches {
		s.AddStoredBlocks(kv, b.keys, b.rows, b.jobID, 0, false)
	}
	if sk.requestDone {
		delete(d.serving, kv)
		s.FinishProducer(kv)
	}
}

// finishServing ends the local request that served kv.
func (d *serveDesk) finishServing(kv string) {
	sk := d.serving[kv]
	switch {
	case sk == nil:
	case sk.state == serveBound:
		delete(d.serving, kv)
		sk.s.FinishProducer(kv)
	case sk.state == serveParked && len(sk.parked) > 0:
		// The decoder has not asked yet: keep the stores until it does or
		// they expire, and finish the round as soon as it is matched.
		sk.requestDone = true
	case sk.state == serveParked:
		delete(d.serving, kv)
	}
}

// unbindServing forgets a closed session's bindings. Its stores were
// reported by the session's Close; a live prefill parks later ones.
func (d *serveDesk) unbindServing(s *session.Session) {
	for kv, sk := range d.serving {
		if sk.state != serveBound || sk.s != s {
			continue
		}
		if sk.claimed {
			sk.state, sk.s = serveParked, nil
		} else {
			delete(d.serving, kv)
		}
	}
}

// clearServing forgets every served kv id (the peer stops); their parked
// stores are jobs the ledger fails.
func (d *serveDesk) clearServing() {
	clear(d.serving)
	d.parkedBatches = 0
}

// tick applies the serving deadlines.
func (d *serveDesk) tick(now time.Time) {
	for kv, sk := range d.serving {
		if sk.deadline.IsZero() || now.Before(sk.deadline) {
			continue
		}
		switch {
		case sk.state == serveParked && len(sk.parked) > 0:
			for _, b := range sk.parked {
				d.report(b.jobID, false, 0)
			}
			d.counts.unboundExpired += int64(len(sk.parked))
			d.logf("WARNING", "no decoder fetched kv_request_id=%s within %v; released %d stored batch(es) (raise unbound_store_timeout_s if prefills outlast it)",
				kv, d.cfg.UnboundStoreTimeout, len(sk.parked))
			d.parkedBatches -= len(sk.parked)
			sk.parked = nil
			sk.state = serveExpired
			sk.deadline = now.Add(d.cfg.ReapedIDRetention)
		case sk.state == serveExpired:
			delete(d.serving, kv)
		case sk.state == serveBound && !sk.claimed:
			// No prefill for it started here; the session fails its fetch
			// at the same deadline.
			delete(d.serving, kv)
		}
	}
}

// parkedStores counts store batches waiting for a decoder (kept as a
// count: the host asks on every step).
func (d *serveDesk) parkedStores() int { return d.parkedBatches }
