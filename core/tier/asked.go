package tier

// A request's first ask is thousands of keys in one host call on vLLM's
// scheduler thread, and every one of them is RETRY: nothing is known of
// keys never asked. So a caching host's first ask is answered at once and
// its keys are kept, copied back to back; the progress loop registers them
// with the sources and sends the lookups, off the host's thread, a few
// requests per hold of the lock. An answer that is not RETRY after all (a
// source already ended, another request under the same kv id was answered)
// reaches the host as a change (TakeAnswers), as every later answer does.
// A host lookup or load of the request registers them first. A call of at
// most inlineAsk keys is not deferred: registering them costs the host a few
// µs, and handing them to the loop would add a goroutine wake-up (often a
// thread's) to the lookup's round trip.

// askedChunk is about how many keys the loop registers per hold of the lock
// (whole requests), so a host call waits for about that much at most.
const askedChunk = 1024

// inlineAsk is the most keys a LookupMany call registers itself.
const inlineAsk = 256

// deferAsk answers a first ask of p at once when it can (see above): every
// result RETRY.
func (b *pullBook) deferAsk(p *pull, keys []byte, keyLen int, out []LookupResult) bool {
	if b.h.closed() || !p.told.cached || !p.probe || p.failed || len(p.order) > 0 || len(p.asked) > 0 ||
		len(keys) == 0 || p.live() == 0 {
		return false
	}
	p.asked, p.askedKeyLen = append([]byte(nil), keys...), keyLen
	for i := range out {
		out[i] = Retry
	}
	// Once per pull: registering its first ask leaves keys in order, or the
	// pull failed or ended, and none of them is deferred again.
	b.toRegister = append(b.toRegister, p)
	return true
}

// registerAsked registers p's deferred keys as lookups of the host would
// have, and queues every answer other than the RETRY the host was given.
// A no-op when nothing is deferred.
func (b *pullBook) registerAsked(p *pull) {
	if len(p.asked) == 0 {
		return
	}
	buf, kl := p.asked, p.askedKeyLen
	p.asked = nil
	if p.told.ended || p.failed {
		return
	}
	n := len(buf) / kl
	p.reserveAnswers(n)
	for off := 0; off < len(buf); off += kl {
		key := buf[off : off+kl : off+kl]
		if p.byKey[string(key)] != nil {
			continue // twice in one call: the host holds one answer for both
		}
		a := p.addKey(key)
		a.told = p.answer(a)
		if a.told != Retry {
			b.countAnswer(a.told)
			p.told.changed = append(p.told.changed, int32(a.pos))
			b.queueAnswers(p)
		}
	}
}

// registerSome registers deferred asks, about askedChunk keys' worth, and
// reports whether any are left; the caller sends their lookups.
func (b *pullBook) registerSome() (more bool) {
	done := 0
	for len(b.toRegister) > 0 && done < askedChunk {
		p := b.toRegister[0]
		b.toRegister[0] = nil
		b.toRegister = b.toRegister[1:]
		if p.askedKeyLen > 0 {
			done += len(p.asked) / p.askedKeyLen
		}
		b.registerAsked(p)
	}
	if len(b.toRegister) == 0 {
		b.toRegister = nil
	}
	return len(b.toRegister) > 0
}
