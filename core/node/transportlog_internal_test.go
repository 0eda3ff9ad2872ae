package node

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/tier"
)

// The control transport's records reach the tier's log unchanged, with one
// format string per record message: the tier rate-limits per format, so a
// flood of one warning cannot silence another.
func TestTransportRecordsAreLoggedOneCausePerMessage(t *testing.T) {
	var formats []string
	var lines []string
	l := &transportLog{}
	l.attach(tier.Logf(func(level, format string, args ...any) {
		formats = append(formats, level+" "+format)
		lines = append(lines, level+" "+fmt.Sprintf(format, args...))
	}))
	log := l.logger()
	log.Warn("dropping message with wrong frame count", "frames", 3, "want", 2)
	log.Warn("dropping message with wrong frame count", "frames", 5, "want", 2)
	log.Warn("router receive failed", "err", "100% broken")
	log.Error("control transport died", "err", "x")
	assert.Equal(t, []string{
		`WARNING control transport: level=WARN msg="dropping message with wrong frame count" frames=3 want=2`,
		`WARNING control transport: level=WARN msg="dropping message with wrong frame count" frames=5 want=2`,
		`WARNING control transport: level=WARN msg="router receive failed" err="100% broken"`,
		`ERROR control transport: level=ERROR msg="control transport died" err=x`,
	}, lines)
	assert.Equal(t, formats[0], formats[1], "one message, one cause")
	assert.NotEqual(t, formats[0], formats[2], "two messages, two causes")
}
