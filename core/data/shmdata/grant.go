package shmdata

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// An offer reads "v2 @peerkv-<32 hex> <32 hex>": the version, our
// abstract socket's name and a token for one peer. v2 is the grant exchange
// of a capped, sized, single-use grant copied by the kernel; a v1 peer (an
// older release) speaks another exchange, so the pair uses another path.
const (
	offerVersion    = "v2"
	socketPrefix    = "@peerkv-"
	tokenLen        = 16
	socketRandLen   = 16
	maxGrants       = 4096
	defaultGrantTTL = 5 * time.Minute
)

type token [tokenLen]byte

// offer is a parsed offer string.
type offer struct {
	socket string
	token  token
}

func (o offer) String() string {
	return offerVersion + " " + o.socket + " " + hex.EncodeToString(o.token[:])
}

var errMalformedOffer = errors.New(`malformed same-host offer: want "v2 @peerkv-<32 hex> <32 hex>"`)

// errOfferVersion: the peer runs a peerkv release whose same-host exchange
// differs from ours; the pair moves rows over another path.
var errOfferVersion = errors.New("the peer's same-host offer is of another version (its peerkv release differs " +
	"from this node's): the same-host path is off for this pair")

// parseOffer accepts exactly what offer.String writes and nothing else.
func parseOffer(s string) (offer, error) {
	parts := strings.Split(s, " ")
	if len(parts) == 3 && parts[0] != offerVersion && len(parts[0]) > 1 && parts[0][0] == 'v' &&
		strings.Trim(parts[0][1:], "0123456789") == "" {
		return offer{}, errOfferVersion
	}
	if len(parts) != 3 || parts[0] != offerVersion {
		return offer{}, errMalformedOffer
	}
	name, ok := strings.CutPrefix(parts[1], socketPrefix)
	if !ok || !isLowerHex(name, socketRandLen) || !isLowerHex(parts[2], tokenLen) {
		return offer{}, errMalformedOffer
	}
	var o offer
	o.socket = parts[1]
	if _, err := hex.Decode(o.token[:], []byte(parts[2])); err != nil {
		return offer{}, errMalformedOffer
	}
	return o, nil
}

// isLowerHex reports whether s is exactly n bytes in lowercase hex.
func isLowerHex(s string, n int) bool {
	if len(s) != 2*n {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// grant is the token one peer may present, once.
type grant struct {
	token   token
	expires time.Time
	used    bool // presented once: kept until it expires only to name a replay
}

// Why a token is refused, as told to its presenter (who may log it).
var (
	errNoSuchGrant = errors.New("no such grant")
	errGrantUsed   = errors.New("grant token already used")
)

// grants holds at most one live token per peer id, and at most maxGrants.
type grants struct {
	ttl time.Duration
	now func() time.Time

	mu     sync.Mutex
	byPeer map[string]grant
}

func newGrants(ttl time.Duration) *grants {
	return &grants{ttl: ttl, now: time.Now, byPeer: map[string]grant{}}
}

// issue mints a token for peerID, replacing its older one.
func (g *grants) issue(peerID string) (token, error) {
	var tok token
	if _, err := rand.Read(tok[:]); err != nil {
		return token{}, fmt.Errorf("random token: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if _, had := g.byPeer[peerID]; !had && len(g.byPeer) >= maxGrants {
		g.evict(now)
	}
	g.byPeer[peerID] = grant{token: tok, expires: now.Add(g.ttl)}
	return tok, nil
}

// evict drops expired grants, or else the one closest to expiring.
func (g *grants) evict(now time.Time) {
	oldest, oldestAt := "", time.Time{}
	for id, gr := range g.byPeer {
		if now.After(gr.expires) {
			delete(g.byPeer, id)
			continue
		}
		if oldest == "" || gr.expires.Before(oldestAt) {
			oldest, oldestAt = id, gr.expires
		}
	}
	if len(g.byPeer) >= maxGrants {
		delete(g.byPeer, oldest)
	}
}

// revoke drops peerID's grant if it is still tok.
func (g *grants) revoke(peerID string, tok token) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gr, ok := g.byPeer[peerID]; ok && gr.token == tok {
		delete(g.byPeer, peerID)
	}
}

// use spends tok, peerID's live token: a token grants the region's fd
// once, so one captured (from a log, a core dump, a relayed connect) is
// worth nothing after the claim it was issued for. A second presentation
// gets errGrantUsed; a wrong, expired, withdrawn or replaced token, or one
// issued to another id, errNoSuchGrant.
func (g *grants) use(peerID string, tok token) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr, ok := g.byPeer[peerID]
	if ok && g.now().After(gr.expires) {
		delete(g.byPeer, peerID)
		ok = false
	}
	if !ok || subtle.ConstantTimeCompare(gr.token[:], tok[:]) != 1 {
		return errNoSuchGrant
	}
	if gr.used {
		return errGrantUsed
	}
	gr.used = true
	g.byPeer[peerID] = gr
	return nil
}
