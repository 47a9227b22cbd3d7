//go:build race

package net

// raceEnabled: the race detector slows every handshake several times, so
// the flood tests flood with fewer loops.
const raceEnabled = true
