package session

// ReportKind says what a Report tells the owner.
type ReportKind int8

const (
	// LoadDone: load job JobID ended (OK), pulling KVID's fetch round Round
	// into Rows.
	// Fence: writes of that peer for this load may still be under way or
	// buffered (no word from it, or it reported a failed transfer): the
	// owner must fence the peer before handing the rows back.
	LoadDone ReportKind = iota + 1
	// StoreDone: store or lookup-pin job JobID ended; Bytes were written.
	StoreDone
	// ConsumerFailed: the owner's live request pulling KVID from Session
	// failed (probes left unanswered when the session closed).
	ConsumerFailed
	// FetchArrived: Session's peer fetched PD kv id KVID; the owner binds it
	// and hands the session what was stored for it.
	FetchArrived
	// InboundReady: Lookup waits for the host's evaluation.
	InboundReady
	// InboundFinished: Lookup is over.
	InboundFinished
	// ProbesAnswered: the peer answered (or a deadline settled) probes of
	// KVID; what the owner told the host about those keys may change.
	ProbesAnswered
	// Ended: the session ended (reported once); the owner forgets it.
	Ended
)

// Report is one thing that happened in a session that its owner must
// apply. A session never calls into its owner (which would call back into
// the session halfway through a change): it hands reports to Env.Report,
// which only queues them, and the owner applies them, in order, after the
// call returns.
type Report struct {
	Kind    ReportKind
	Session *Session
	JobID   int64
	OK      bool
	Bytes   int64
	KVID    string
	Round   uint64 // LoadDone: the fetch round (RequestBlocks' result)
	Rows    []uint64
	Lookup  *InboundLookup
	// Fence: see LoadDone.
	Fence bool
	// Sums (LoadDone, OK, verified pulls): the producer's checksum of each
	// row, parallel to Rows; the owner checks the rows where they landed
	// before it reports the load successful. Integrity names why the
	// session failed a load the producer reported successful (e.g.
	// IntegrityMissing), "" otherwise.
	Sums      []uint64
	Integrity string
}

// report hands r to the owner, naming this session, as does the inbound
// lookup r carries: the roles that make reports know no Session.
func (s *Session) report(r Report) {
	r.Session = s
	if r.Lookup != nil && r.Lookup.s == nil {
		r.Lookup.s = s
	}
	s.env.Report(r)
}
