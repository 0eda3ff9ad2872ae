package eventq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

func TestEventsComeOutInOrderWithoutBlockingThePusher(t *testing.T) {
	q := New()
	for i := 0; i < 1000; i++ { // nobody pops yet: pushes never wait
		require.True(t, q.Push(control.Event{PeerID: string(rune('a' + i%26))}))
	}
	for i := 0; i < 1000; i++ {
		ev, ok := q.Pop()
		require.True(t, ok)
		require.Equal(t, string(rune('a'+i%26)), ev.PeerID)
	}
}

func TestPopWaitsForAPush(t *testing.T) {
	q := New()
	got := make(chan string, 1)
	go func() {
		ev, _ := q.Pop()
		got <- ev.PeerID
	}()
	time.Sleep(10 * time.Millisecond)
	q.Push(control.Event{PeerID: "late"})
	select {
	case id := <-got:
		require.Equal(t, "late", id)
	case <-time.After(5 * time.Second):
		t.Fatal("Pop did not return the event pushed after it began waiting")
	}
}

func TestCloseEndsAWaitingPopAndRefusesLaterPushes(t *testing.T) {
	q := New()
	q.Push(control.Event{PeerID: "dropped"})
	done := make(chan bool, 1)
	q.Close()
	go func() {
		_, ok := q.Pop()
		done <- ok
	}()
	select {
	case ok := <-done:
		require.False(t, ok, "a closed queue hands out nothing it held")
	case <-time.After(5 * time.Second):
		t.Fatal("Pop on a closed queue did not return")
	}
	require.False(t, q.Push(control.Event{}))
	select {
	case <-q.Closed():
	default:
		t.Fatal("Closed() not closed after Close")
	}
	q.Close() // twice is harmless
}
