package data

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOutboxSendWaitsForReaderUntilClosing(t *testing.T) {
	o := NewOutbox(1)
	require.True(t, o.Send(Completion{ID: 1}))

	sent := make(chan bool)
	go func() { sent <- o.Send(Completion{ID: 2}) }()
	select {
	case <-sent:
		t.Fatal("Send did not wait for room")
	case <-time.After(50 * time.Millisecond):
	}
	o.StartClosing()
	select {
	case ok := <-sent:
		assert.False(t, ok, "a full outbox drops once closing")
	case <-time.After(5 * time.Second):
		t.Fatal("Send still blocked after StartClosing")
	}

	assert.Equal(t, uint64(1), (<-o.C()).ID)
	assert.True(t, o.Send(Completion{ID: 3}), "closing still delivers what fits")
	o.Finish()
	o.Finish()
	assert.False(t, o.Send(Completion{ID: 4}), "nothing after Finish")
	assert.Equal(t, uint64(3), (<-o.C()).ID)
	_, open := <-o.C()
	assert.False(t, open)
}
