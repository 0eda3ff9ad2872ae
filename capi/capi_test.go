package main

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	corenode "github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/params"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHandlesStartAtAnUnlikelyValueAndAreNeverReused(t *testing.T) {
	tbl := handleTable{next: firstHandle, nodes: map[int64]*node{}}
	a, b := tbl.add(&node{}), tbl.add(&node{})
	assert.Equal(t, int64(42<<16+1), a)
	assert.Equal(t, a+1, b)

	_, released, err := tbl.remove(a)
	require.NoError(t, err)
	assert.False(t, released)
	_, released, err = tbl.remove(a)
	require.NoError(t, err, "destroying a released handle is idempotent")
	assert.True(t, released)

	_, err = tbl.get(a)
	require.ErrorIs(t, err, errUnknownHandle)
	assert.Contains(t, err.Error(), "destroyed")
	assert.NotEqual(t, a, tbl.add(&node{}), "a released handle must not come back")

	for _, h := range []int64{0, 1, -1, firstHandle - 1, 1 << 40} {
		_, err := tbl.get(h)
		require.ErrorIs(t, err, errUnknownHandle, "handle %d", h)
		_, released, err := tbl.remove(h)
		assert.False(t, released)
		require.ErrorIs(t, err, errUnknownHandle, "handle %d", h)
	}
	assert.Equal(t, 2, tbl.len())
}

func TestADestroyedHandleStillShuttingDownIsFoundByASecondDestroy(t *testing.T) {
	tbl := handleTable{next: firstHandle, nodes: map[int64]*node{}}
	nd := &node{}
	h := tbl.add(nd)
	got, released, err := tbl.remove(h)
	require.NoError(t, err)
	assert.False(t, released)
	assert.Same(t, nd, got)

	again, released, err := tbl.remove(h)
	require.NoError(t, err)
	assert.True(t, released)
	assert.Same(t, nd, again, "the second destroy waits on the same node's shutdown")

	tbl.retired(h)
	gone, released, err := tbl.remove(h)
	require.NoError(t, err)
	assert.True(t, released)
	assert.Nil(t, gone, "once torn down there is nothing to wait for")
}

func TestShutdownOfADestroyedHandleWaitsForOrReportsTheOneTeardown(t *testing.T) {
	tbl := handleTable{next: firstHandle, nodes: map[int64]*node{}}
	nd := &node{}
	h := tbl.add(nd)
	live, err := tbl.shuttingDown(h)
	require.NoError(t, err)
	assert.Same(t, nd, live)

	_, _, err = tbl.remove(h)
	require.NoError(t, err)
	retiring, err := tbl.shuttingDown(h)
	require.NoError(t, err)
	assert.Same(t, nd, retiring, "a shutdown racing a destroy waits on the same node's shutdown")

	tbl.retired(h)
	gone, err := tbl.shuttingDown(h)
	require.NoError(t, err, "a shutdown entering after the destroy returned is OK: the teardown is done")
	assert.Nil(t, gone)
	_, err = tbl.get(h)
	require.ErrorIs(t, err, errUnknownHandle, "every other call on the destroyed handle is unknown")
	assert.Contains(t, err.Error(), "destroyed")

	for _, h := range []int64{0, 1, -1, firstHandle - 1, tbl.next, 1 << 40} {
		p, err := tbl.shuttingDown(h)
		require.ErrorIs(t, err, errUnknownHandle, "handle %d was never created", h)
		assert.Nil(t, p)
	}
}

func TestStatusForMapsEveryCoreSentinel(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("context: %w", err) }
	cases := []struct {
		err  error
		want any
	}{
		{wrap(tier.ErrInvalidArgument), statusInvalidArgument},
		{wrap(errUnknownHandle), statusUnknownHandle},
		{wrap(tier.ErrBadParams), statusBadParams},
		{wrap(params.ErrForbidden), statusBadParams},
		{wrap(params.ErrMalformed), statusBadParams},
		{fmt.Errorf("%w: %w", tier.ErrBadParams, tier.ErrInvalidArgument), statusBadParams},
		{wrap(tier.ErrUnknownRequest), statusUnknownRequest},
		{wrap(tier.ErrDuplicate), statusDuplicate},
		{wrap(tier.ErrClosed), statusClosed},
		{wrap(tier.ErrTimeout), statusTimeout},
		{wrap(corenode.ErrUnavailable), statusUnavailable},
		{wrap(corenode.ErrTransport), statusTransport},
		{errors.New("unclassified"), statusInternal},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, statusFor(c.err, statusInternal), "%v", c.err)
	}
}

func TestStatusCodesMatchTheHeader(t *testing.T) {
	// cgo reads the values from peerkv.h; this pins the numbers the Python
	// binding and other hosts hard-code.
	want := map[string]any{
		"OK": statusOK, "INVALID_ARGUMENT": statusInvalidArgument, "UNKNOWN_HANDLE": statusUnknownHandle,
		"BAD_PARAMS": statusBadParams, "UNKNOWN_REQUEST": statusUnknownRequest, "BUFFER_TOO_SMALL": statusBufferTooSmall,
		"TRANSPORT": statusTransport, "CLOSED": statusClosed, "INTERNAL": statusInternal, "TIMEOUT": statusTimeout,
		"DUPLICATE": statusDuplicate, "UNAVAILABLE": statusUnavailable, "ABI_MISMATCH": statusABIMismatch,
	}
	numbers := []int{0, -1, -2, -3, -4, -5, -6, -7, -9, -10, -11, -12, -13}
	names := []string{"OK", "INVALID_ARGUMENT", "UNKNOWN_HANDLE", "BAD_PARAMS", "UNKNOWN_REQUEST", "BUFFER_TOO_SMALL",
		"TRANSPORT", "CLOSED", "INTERNAL", "TIMEOUT", "DUPLICATE", "UNAVAILABLE", "ABI_MISMATCH"}
	for i, name := range names {
		assert.EqualValues(t, numbers[i], want[name], name)
	}
}

func TestInboundKeyLenRequiresUniformKeys(t *testing.T) {
	assert.Equal(t, 0, inboundKeyLen(tier.Inbound{Kind: tier.InboundFinish}))
	assert.Equal(t, 3, inboundKeyLen(tier.Inbound{Keys: [][]byte{[]byte("abc"), []byte("def")}}))
	assert.Equal(t, -1, inboundKeyLen(tier.Inbound{Keys: [][]byte{[]byte("abc"), []byte("de")}}))
}

func TestVersionStringNamesTheBuildAndGo(t *testing.T) {
	assert.Regexp(t, regexp.MustCompile(`^peerkv \S+ \(go1\.\d+`), versionString())
	assert.True(t, strings.HasPrefix(versionString(), "peerkv "+version+" "))
}
