// Package testutil holds what the tests of several lsync packages share:
// the one poller (Eventually), id and HLC builders, Recorder, a fake
// transport observer, and RerunAsNobody, which runs a test that needs an
// ordinary user's limits as uid 65534 when the tests run as root (as in
// CI) rather than skip it. Nothing a host app imports.
//
// It imports messages and the standard library only, so the tests of any
// other package (net and persistence included, which it must not import
// back) can use it.
package testutil
