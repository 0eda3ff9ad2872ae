package main

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/peerkv/peerkv/tests/hostile"
)

// Test files cannot name cgo's C types, so these helpers take each export as
// a func value and let type inference supply them; everything else is passed
// as Go memory (the exports never hand these pointers to C).

func cstr[Ch any](s string) *Ch {
	b := append([]byte(s), 0)
	return (*Ch)(unsafe.Pointer(&b[0]))
}

func createNode[A ~uint32, U ~uint64, Ch any, H ~int64, Sz ~uint64, R ~int32](tb testing.TB,
	create func(A, unsafe.Pointer, U, U, *Ch, *H, *Ch, Sz) R, abi uint32, options string) H {
	region := make([]byte, 4*4096)
	var h H
	errBuf := make([]byte, 512)
	if rc := create(A(abi), unsafe.Pointer(&region[0]), 4, 4096, cstr[Ch](options), &h, (*Ch)(unsafe.Pointer(&errBuf[0])), Sz(len(errBuf))); rc != 0 {
		tb.Fatalf("peerkv_create: %d %s", rc, errBuf)
	}
	return h
}

// BenchmarkHotExports measures what one host call costs on the calls vLLM's
// scheduler thread makes every step, idle node (nothing queued): allocs/op
// is what the preamble and decoding allocate per call.
//
//	go test -run '^$' -bench HotExports -benchmem ./capi
func BenchmarkHotExports(b *testing.B) {
	port := hostile.FreePort(b, "127.0.0.1")
	h := createNode(b, pkvgo_create, 1, fmt.Sprintf(`{"host":"127.0.0.1","port":%d,"data_port":0,"key_len":4}`, port))
	b.Cleanup(func() { pkvgo_destroy(h, nil, 0) })
	errBuf := make([]byte, 512)
	eb := unsafe.Pointer(&errBuf[0])
	el := uint64(len(errBuf))
	reqID := []byte("req-1\x00")
	req := unsafe.Pointer(&reqID[0])
	var policy int32
	if rc := callRequestStart(pkvgo_request_start, h, req, &policy, eb, el); rc != 0 {
		b.Fatalf("peerkv_request_start: %d %s", rc, errBuf)
	}
	keys := []byte("k001k002k003k004")
	results := make([]int32, 4)
	b.Run("lookup", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if rc := callLookup(pkvgo_lookup, h, req, unsafe.Pointer(&keys[0]), 4, 4, &results[0], eb, el); rc != 0 {
				b.Fatalf("peerkv_lookup: %d %s", rc, errBuf)
			}
		}
	})
	buf := make([]byte, 4096)
	var n uint64
	b.Run("take_answers", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if rc := callTake(pkvgo_take_answers, h, unsafe.Pointer(&buf[0]), uint64(len(buf)), &n, eb, el); rc != 0 {
				b.Fatalf("peerkv_take_answers: %d %s", rc, errBuf)
			}
		}
	})
	b.Run("next_inbound", func(b *testing.B) {
		b.ReportAllocs()
		var lookupID int64
		var kind, first int32
		var needed, nKeys uint64
		for b.Loop() {
			if rc := callNextInbound(pkvgo_next_inbound, h, &lookupID, &kind, &first, unsafe.Pointer(&buf[0]), 256,
				&needed, unsafe.Pointer(&buf[256]), 1024, &nKeys, eb, el); rc != 1 {
				b.Fatalf("peerkv_next_inbound: %d %s", rc, errBuf)
			}
		}
	})
	b.Run("has_pending_work", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if rc := pkvgo_has_pending_work(h); rc < 0 {
				b.Fatalf("peerkv_has_pending_work: %d", rc)
			}
		}
	})
}

func callRequestStart[H ~int64, Ch any, I ~int32, Sz ~uint64, R ~int32](f func(H, *Ch, *Ch, *I, *Ch, Sz) R,
	h H, req unsafe.Pointer, policy *int32, eb unsafe.Pointer, el uint64) R {
	return f(h, (*Ch)(req), nil, (*I)(unsafe.Pointer(policy)), (*Ch)(eb), Sz(el))
}

func callLookup[H ~int64, Ch any, U8 any, Sz ~uint64, I ~int32, R ~int32](f func(H, *Ch, *U8, Sz, Sz, *I, *Ch, Sz) R,
	h H, req, keys unsafe.Pointer, keyLen, n uint64, results *int32, eb unsafe.Pointer, el uint64) R {
	return f(h, (*Ch)(req), (*U8)(keys), Sz(keyLen), Sz(n), (*I)(unsafe.Pointer(results)), (*Ch)(eb), Sz(el))
}

func callTake[H ~int64, U8 any, Sz ~uint64, Ch any, R ~int32](f func(H, *U8, Sz, *Sz, *Ch, Sz) R,
	h H, buf unsafe.Pointer, bufLen uint64, nOut *uint64, eb unsafe.Pointer, el uint64) R {
	return f(h, (*U8)(buf), Sz(bufLen), (*Sz)(unsafe.Pointer(nOut)), (*Ch)(eb), Sz(el))
}

func callNextInbound[H ~int64, I64 ~int64, I ~int32, Ch any, Sz ~uint64, U8 any, R ~int32](
	f func(H, *I64, *I, *I, *Ch, Sz, *Sz, *U8, Sz, *Sz, *Ch, Sz) R,
	h H, lookupID *int64, kind, first *int32, reqBuf unsafe.Pointer, reqCap uint64, needed *uint64,
	keysBuf unsafe.Pointer, keysCap uint64, nKeys *uint64, eb unsafe.Pointer, el uint64) R {
	return f(h, (*I64)(unsafe.Pointer(lookupID)), (*I)(unsafe.Pointer(kind)), (*I)(unsafe.Pointer(first)), (*Ch)(reqBuf),
		Sz(reqCap), (*Sz)(unsafe.Pointer(needed)), (*U8)(keysBuf), Sz(keysCap), (*Sz)(unsafe.Pointer(nKeys)), (*Ch)(eb), Sz(el))
}
