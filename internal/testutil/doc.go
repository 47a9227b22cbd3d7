// Package testutil holds what the tests of several lsync packages share:
// the one poller (Eventually), id and HLC builders, and Recorder, a fake
// transport observer. Nothing a host app imports.
//
// It imports messages and the standard library only, so the tests of any
// other package (net and persistence included, which it must not import
// back) can use it.
package testutil
