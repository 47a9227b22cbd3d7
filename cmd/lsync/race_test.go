//go:build race

package main

// raceEnabled makes TestMain build the daemon binary with -race too.
const raceEnabled = true
