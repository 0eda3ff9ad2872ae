package tier_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// silentPeer is a peer id on the hub that never answers (its frames are read
// and ignored).
func (c *cluster) silentPeer(id string) {
	tr := c.ctl.Transport(id)
	tr.Hand(func(control.Event) {})
	c.t.Cleanup(func() { _ = tr.Close() })
}

// A peer that answers our dial under another spelling of its id (a host
// name for the IP we dial, or the reverse) is named once, with both ids.
func TestAPeerAnsweringUnderAnotherSpellingOfItsIDIsNamed(t *testing.T) {
	for _, tc := range []struct{ name, dialHost, ownID string }{
		{"we dial its IP, it calls itself by name", "127.0.0.9", "prod-a:6002"},
		{"we dial its name, it calls itself by IP", "prod-b", "127.0.0.9:6002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			defer tier.StubResolver(map[string][]string{"prod-b": {"127.0.0.9"}})()
			cons := c.node(1)
			dialed := tc.dialHost + ":6002"
			c.silentPeer(dialed)
			_, err := cons.StartRequest("r", []byte(fmt.Sprintf(
				`{"remote_kv_source":{"kv_request_id":"kv","remote_host":%q,"remote_port":6002}}`, tc.dialHost)))
			require.NoError(t, err)
			cons.lookup("r", keys(1))
			require.NoError(t, cons.OnScheduleEnd())

			frame, err := protocol.Encode(&protocol.Connect{PeerID: tc.ownID, AgentMetadata: []byte{}, NumBlocks: numRows,
				BlockLen: rowLen, HashSeed: "42", ConfigFingerprint: "0123456789abcdef"})
			require.NoError(t, err)
			require.True(t, c.ctl.InjectFrom(cons.id, tc.ownID, "127.0.0.9", frame))
			var logs strings.Builder
			want := fmt.Sprintf("peer %s answered our dial of %s under its own id %s", tc.ownID, dialed, tc.ownID)
			require.Eventually(t, func() bool { return strings.Contains(cons.logsSoFar(&logs), want) },
				5*time.Second, 5*time.Millisecond, "logs: %s", logs.String())
		})
	}
}

// Another peer on the same port, from another address, is no spelling.
func TestAnotherPeerOnTheSamePortIsNotTakenForAnotherSpelling(t *testing.T) {
	c := newCluster(t)
	cons := c.node(1)
	c.silentPeer("127.0.0.9:6002")
	_, err := cons.StartRequest("r", p2pParamsTo("kv", "127.0.0.9:6002"))
	require.NoError(t, err)
	frame, err := protocol.Encode(&protocol.Connect{PeerID: "127.0.0.8:6002", AgentMetadata: []byte{}, NumBlocks: numRows,
		BlockLen: rowLen, HashSeed: "42", ConfigFingerprint: "0123456789abcdef"})
	require.NoError(t, err)
	require.True(t, c.ctl.InjectFrom(cons.id, "127.0.0.8:6002", "127.0.0.8", frame))
	require.Eventually(t, func() bool { return cons.Stats().SessionsOpened == 2 }, 5*time.Second, 5*time.Millisecond)
	require.NotContains(t, string(cons.TakeLogs(1<<20)), "answered our dial")
}
