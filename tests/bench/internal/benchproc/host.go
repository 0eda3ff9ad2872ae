package benchproc

import (
	"net"

	"github.com/peerkv/peerkv/core/tier"
)

// FreePort is a TCP port on 127.0.0.1 free a moment ago; callers retry if
// another process takes it meanwhile.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ServeInbound answers every queued inbound lookup as a host does: HIT,
// pinned at the row held reports, for the keys it holds, MISS otherwise
// (held also gets how many of the lookup's keys were hits before this one);
// a lookup with hits pins under a new job id from nextJob. It returns the
// first error AnswerInbound gave, having answered the rest.
func ServeInbound(t *tier.Tier, held func(key []byte, hitsBefore int) (row int64, ok bool), nextJob *int64) error {
	var first error
	for {
		in, ok, _ := t.NextInbound(nil)
		if !ok {
			return first
		}
		if in.Kind != tier.InboundEvaluate {
			continue
		}
		res := make([]tier.LookupResult, len(in.Keys))
		var pins []int64
		for i, k := range in.Keys {
			res[i] = tier.Miss
			if row, ok := held(k, len(pins)); ok {
				res[i] = tier.Hit
				pins = append(pins, row)
			}
		}
		job := int64(-1)
		if len(pins) > 0 {
			*nextJob++
			job = *nextJob
		}
		if _, err := t.AnswerInbound(in.LookupID, res, job, pins); err != nil && first == nil {
			first = err
		}
	}
}
