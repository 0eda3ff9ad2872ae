package netns

import (
	"fmt"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	lossPercent = 5 // of the packets between the two hosts, each way, dropped at random
	lossPulls   = 10
	lossRows    = 64 // 256 KiB a load
	// lossLoadBound is when a load must be reported: load_timeout_s +
	// abort_ack_timeout_s of hostOptions, with room for a loaded machine.
	lossLoadBound = 2*time.Second + time.Second + 2*time.Second
	lossLookup    = 2 * time.Second // lookup_timeout_s
)

// Between a producer and a consumer the router drops 5 % of the packets
// each way, at random (nft numgen): each PD load is reported within
// load_timeout_s + abort_ack_timeout_s, and each P2P lookup settles within
// lookup_timeout_s; loads that succeed hold the right bytes, pulls still
// succeed (TCP recovers the loss), and every job of both hosts is reported
// once.
func TestPullsOverALossyLinkKeepTheirDeadlines(t *testing.T) {
	t.Parallel()
	p, c := newHostIndex(), newHostIndex()
	prod := startHost(t, p, "producer", hostOptions(p, nil))
	cons := startHost(t, c, "consumer", hostOptions(c, map[string]any{"lookup_timeout_s": lossLookup.Seconds()}))
	between := fmt.Sprintf("ip saddr { %[1]s, %[2]s } ip daddr { %[1]s, %[2]s }", hostIP(p), hostIP(c))
	filter(t, fmt.Sprintf("%s numgen random mod 100 < %d counter drop", between, lossPercent))

	loaded, hits := 0, 0
	for i := range lossPulls {
		kv := fmt.Sprintf("lossy%d", i)
		prod.call(nil, replyWithin, "store %s %d", kv, lossRows)
		var r loadResult
		cons.call(&r, lossLoadBound+replyWithin, "load %s %d %s %d %d", kv, lossRows, hostIP(p), peerPort, lossLoadBound.Milliseconds())
		require.True(t, r.Reported, "load %d not reported within %v", i, lossLoadBound)
		assert.Zero(t, r.WrongRows, "load %d landed wrong bytes", i)
		if r.Success {
			loaded++
		}

		prod.call(nil, replyWithin, "hold %s", kv)
		var l lookupResult
		cons.call(&l, 2*lossLookup+replyWithin, "lookup %s %s %d %d", kv, hostIP(p), peerPort, (2 * lossLookup).Milliseconds())
		assert.NotEqual(t, "RETRY", l.Result, "lookup %d unsettled after twice lookup_timeout_s", i)
		assert.Less(t, l.Ms, (lossLookup + 1500*time.Millisecond).Milliseconds(), "lookup %d settled past lookup_timeout_s", i)
		if l.Result == "HIT" {
			hits++
		}
	}
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	require.NoError(t, err, "nft list ruleset: %s", out)
	dropped := regexp.MustCompile(`numgen random mod 100 < \d+ counter packets (\d+)`).FindStringSubmatch(string(out))
	require.NotNil(t, dropped, "no loss rule in the ruleset:\n%s", out)
	t.Logf("the router dropped %s packets between the hosts", dropped[1])
	assert.NotEqual(t, "0", dropped[1], "the loss rule dropped nothing")
	t.Logf("%d %% loss each way: %d of %d loads of %d KiB landed, %d of %d lookups hit", lossPercent, loaded, lossPulls,
		lossRows*4, hits, lossPulls)
	// TCP recovers the loss: pulls land (how many depends on the draw and
	// the machine's load; the deadlines above are the claim).
	assert.Positive(t, loaded, "no load landed despite TCP's retransmissions")
	assert.Positive(t, hits, "no lookup hit despite TCP's retransmissions")
	for _, h := range []*host{prod, cons} {
		var l ledgerState
		h.call(&l, 2*replyWithin, "ledger %d", replyWithin.Milliseconds())
		assert.Empty(t, l.Problems, "%s reported a job twice or one never submitted", h.name)
		assert.Empty(t, l.Unreported, "%s never reported these jobs", h.name)
	}
}
