// Package hostsim plays the part of a tier's host (vLLM's scheduler) in Go
// tests and benches: the serve pass that answers peers' inbound lookups
// from the rows the host holds and pins the hits, the steps that look keys
// up until no answer is RETRY, and the record of finished jobs, each
// reported once. The Go host simulations (core/tier and core/node tests,
// tests/faults, the benches) use it, so the host's side is written once.
package hostsim

import (
	"fmt"
	"slices"
	"time"

	"github.com/peerkv/peerkv/core/tier"
)

// Held says whether the host's CPU tier holds key, and at which row;
// hitsBefore is how many of the lookup's keys before this one were hits.
// A nil Held holds nothing.
type Held func(key []byte, hitsBefore int) (row int64, ok bool)

// Rows is Held over a map of key to row.
func Rows[R ~int | ~int64](rows map[string]R) Held {
	return func(key []byte, _ int) (int64, bool) {
		row, ok := rows[string(key)]
		return int64(row), ok
	}
}

// Pins numbers the pin jobs of a host's answers.
type Pins interface {
	// Next is the job id the hits of a lookup of req are pinned under.
	Next(req string) int64
	// Refused is told a pin job the tier refused with its answer: it will
	// never be reported.
	Refused(job int64)
}

// Count is Pins numbering each pin job ++*next, as a host numbers every
// job it submits from one counter.
func Count(next *int64) Pins { return counter{next} }

type counter struct{ next *int64 }

func (c counter) Next(string) int64 { *c.next++; return *c.next }
func (counter) Refused(int64)       {}

// Answer is the host's answer to one lookup: HIT for each key held, MISS
// for the others, and the rows of the hits, in order, to pin.
func Answer(keys [][]byte, held Held) ([]tier.LookupResult, []int64) {
	results := make([]tier.LookupResult, len(keys))
	var pins []int64
	for i, k := range keys {
		results[i] = tier.Miss
		if held == nil {
			continue
		}
		if row, ok := held(k, len(pins)); ok {
			results[i] = tier.Hit
			pins = append(pins, row)
		}
	}
	return results, pins
}

// Serve is one serve pass: every queued inbound lookup answered from held,
// the hits of each pinned as one job numbered by pins (-1, no job, when
// none). It returns how many items it took and the first error
// AnswerInbound gave, having answered the rest.
func Serve(t *tier.Tier, held Held, pins Pins) (int, error) {
	var first error
	taken := 0
	for {
		in, ok, _ := t.NextInbound(nil)
		if !ok {
			return taken, first
		}
		taken++
		if in.Kind != tier.InboundEvaluate {
			continue
		}
		results, rows := Answer(in.Keys, held)
		job := int64(-1)
		if len(rows) > 0 {
			job = pins.Next(in.ReqID)
		}
		if _, err := t.AnswerInbound(in.LookupID, results, job, rows); err != nil {
			if job >= 0 {
				pins.Refused(job)
			}
			if first == nil {
				first = fmt.Errorf("answer lookup %d: %w", in.LookupID, err)
			}
		}
	}
}

// Jobs is a host's record of its finished jobs, by job id: the library
// reports each job exactly once.
type Jobs map[int64]tier.JobResult

// Collect takes the tier's finished jobs; a job reported twice is an
// error (the library broke its promise).
func (j Jobs) Collect(t *tier.Tier) error {
	for _, r := range t.GetFinished(1024) {
		if _, dup := j[r.JobID]; dup {
			return fmt.Errorf("job %d reported twice", r.JobID)
		}
		j[r.JobID] = r
	}
	return nil
}

// Wait collects until job id is reported, running between (the host's
// other work, such as a serve pass; may be nil) before each poll, and
// fails once within has passed.
func (j Jobs) Wait(t *tier.Tier, id int64, within time.Duration, between func()) (tier.JobResult, error) {
	deadline := time.Now().Add(within)
	for {
		if between != nil {
			between()
		}
		if err := j.Collect(t); err != nil {
			return tier.JobResult{}, err
		}
		if r, ok := j[id]; ok {
			return r, nil
		}
		if time.Now().After(deadline) {
			return tier.JobResult{}, fmt.Errorf("%s: job %d not reported within %v", t.LocalID(), id, within)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Settle runs host steps (a lookup of keys for req, then the step's end,
// then between, which may be nil) until no answer is RETRY, and returns
// the answers; it fails once within has passed, with the last answers.
func Settle(t *tier.Tier, req string, keys [][]byte, within time.Duration, between func()) ([]tier.LookupResult, error) {
	got := make([]tier.LookupResult, len(keys))
	deadline := time.Now().Add(within)
	for {
		if err := t.Lookup(req, keys, got); err != nil {
			return nil, err
		}
		if err := t.OnScheduleEnd(); err != nil {
			return nil, err
		}
		if between != nil {
			between()
		}
		if !slices.Contains(got, tier.Retry) {
			return got, nil
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("%s: lookups of %s still RETRY after %v: %v", t.LocalID(), req, within, got)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
