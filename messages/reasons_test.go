package messages

import (
	"fmt"
	"testing"
)

func TestReasonsAreRegisteredOnce(t *testing.T) {
	seen := map[Reason]bool{}
	for _, r := range Reasons() {
		if seen[r] {
			t.Errorf("reason %q registered twice", r)
		}
		seen[r] = true
		if !r.Known() {
			t.Errorf("registered reason %q is not Known", r)
		}
	}
	if Reason("no_such_reason").Known() {
		t.Error("an unregistered reason is Known")
	}
}

func TestReasonOfClassifiesEverySentinel(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Reason
	}{
		{fmt.Errorf("x: %w", ErrFrameTooLarge), ReasonFrameTooLarge},
		{&VersionError{Local: 1, Remote: 2}, ReasonSchemaMismatch},
		{fmt.Errorf("x: %w", ErrUnknownType), ReasonUnknownType},
		{fmt.Errorf("x: %w", ErrTruncated), ReasonTruncated},
		{fmt.Errorf("x: %w", ErrMalformed), ReasonMalformed},
		{fmt.Errorf("anything else"), ReasonMalformed},
	} {
		if got := ReasonOf(tc.err); got != tc.want {
			t.Errorf("ReasonOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
