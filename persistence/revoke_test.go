package persistence

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// Which revocation rows count, decided in HLC order (pure).
func TestEffectiveRevocations(t *testing.T) {
	members := map[messages.DeviceID]bool{devA: true, devB: true, devC: true}
	member := func(d messages.DeviceID) bool { return members[d] }
	rev := func(dev, by messages.DeviceID, ts uint64) Revocation {
		return Revocation{Device: dev, By: by, HLC: hlcAt(ts, 0, by)}
	}
	for _, tc := range []struct {
		name    string
		rows    []Revocation
		want    map[messages.DeviceID]uint64 // device -> timestamp of its revocation
		refused int
	}{
		{"one", []Revocation{rev(devC, devA, 10)}, map[messages.DeviceID]uint64{devC: 10}, 0},
		{"the oldest of two counts", []Revocation{rev(devC, devB, 20), rev(devC, devA, 10)}, map[messages.DeviceID]uint64{devC: 10}, 0},
		{"a non-member's does not", []Revocation{rev(devC, devR, 10)}, map[messages.DeviceID]uint64{}, 1},
		{"a device revokes itself", []Revocation{rev(devR, devR, 10)}, map[messages.DeviceID]uint64{devR: 10}, 0},
		{"mutual: the older word wins", []Revocation{rev(devA, devC, 20), rev(devC, devA, 10)}, map[messages.DeviceID]uint64{devC: 10}, 1},
		{"mutual, the other way", []Revocation{rev(devA, devC, 10), rev(devC, devA, 20)}, map[messages.DeviceID]uint64{devA: 10}, 1},
		{"a revoked device revokes no one after", []Revocation{rev(devC, devA, 10), rev(devB, devC, 30)}, map[messages.DeviceID]uint64{devC: 10}, 1},
		{"but before, it did", []Revocation{rev(devB, devC, 5), rev(devC, devA, 10)}, map[messages.DeviceID]uint64{devB: 5, devC: 10}, 0},
		{"a bad signature never counts", []Revocation{{Device: devC, By: devA, HLC: hlcAt(10, 0, devA), Refused: "bad"}}, map[messages.DeviceID]uint64{}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, refused := EffectiveRevocations(tc.rows, member)
			if len(got) != len(tc.want) || len(refused) != tc.refused {
				t.Fatalf("counted %v, refused %v", got, refused)
			}
			for d, ts := range tc.want {
				if got[d].HLC.Timestamp != baseTS+ts {
					t.Fatalf("%s revoked at %v, want %d", d, got[d].HLC, ts)
				}
			}
		})
	}
	// remove_rows of a later row adds to the first.
	r2 := rev(devC, devB, 20)
	r2.RemoveRows = true
	got, _ := EffectiveRevocations([]Revocation{rev(devC, devA, 10), r2}, member)
	if !got[devC].RemoveRows || got[devC].HLC.Timestamp != baseTS+10 {
		t.Fatalf("%+v", got[devC])
	}
}

// revokeFields is a revocation row's fields.
func revokeFields(dev, by messages.DeviceID, removeRows bool) map[string]any {
	return map[string]any{"device_uuid": messages.UUID(dev), "by": messages.UUID(by), "at": time.Now().UnixMilli(),
		"reason": "stolen", "remove_rows": removeRows}
}

// A revocation and the revoked device's writes, in every delivery order,
// end the same: what it wrote before the revocation's HLC stays, what it
// wrote after is refused or removed (shared and device-owned alike).
func TestRevocationAnyDeliveryOrder(t *testing.T) {
	wallC, wallA := newFakeWall(timeAt(1000)), newFakeWall(timeAt(1000))
	c := newLibOpts(t, Options{Self: devC, Wall: wallC.Now})
	a := newLibOpts(t, Options{Self: devA, Wall: wallA.Now})

	// C: its device row, a tag and an audit row before; A revokes C; then
	// C writes another tag, renames nothing, and another audit row.
	devRow, _, err := c.WriteState(ModelDevice, messages.UUID(devC), map[string]any{"name": "phone"})
	if err != nil {
		t.Fatal(err)
	}
	aRow, _, err := a.WriteState(ModelDevice, messages.UUID(devA), map[string]any{"name": "laptop"})
	if err != nil {
		t.Fatal(err)
	}
	before, _, err := c.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "before"})
	if err != nil {
		t.Fatal(err)
	}
	auditBefore, _, err := c.WriteState(ModelAuditLog, uid(1), map[string]any{"action": "before"})
	if err != nil {
		t.Fatal(err)
	}
	wallA.Set(timeAt(2000))
	rv, _, err := a.CommitShared(ModelRevocation, messages.UUID{}, messages.OpInsert, revokeFields(devC, devA, false))
	if err != nil {
		t.Fatal(err)
	}
	wallC.Set(timeAt(3000))
	after, _, err := c.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "after"})
	if err != nil {
		t.Fatal(err)
	}
	auditAfter, _, err := c.WriteState(ModelAuditLog, uid(2), map[string]any{"action": "after"})
	if err != nil {
		t.Fatal(err)
	}

	type step struct {
		name string
		do   func(t *testing.T, r *Library) ApplyResult
	}
	shared := func(cs ...messages.SharedChange) func(t *testing.T, r *Library) ApplyResult {
		return func(t *testing.T, r *Library) ApplyResult {
			res, err := r.ApplyShared(cs, ApplyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
	state := func(recs ...messages.StateRecord) func(t *testing.T, r *Library) ApplyResult {
		return func(t *testing.T, r *Library) ApplyResult {
			res, err := r.ApplyState(devC, ModelAuditLog, recs, ApplyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
	steps := []step{
		{"tag before", shared(before)},
		{"tag after", shared(after)},
		{"revocation", shared(rv)},
		{"audit after", state(auditAfter)},
	}
	var want string
	for _, order := range permutations(len(steps)) {
		var names []string
		for _, i := range order {
			names = append(names, steps[i].name)
		}
		t.Run(fmt.Sprint(names), func(t *testing.T) {
			r := newLib(t, devR)
			mustApply(t, r, devC, ModelDevice, devRow)
			mustApply(t, r, devA, ModelDevice, aRow) // A is a member
			mustApply(t, r, devC, ModelAuditLog, auditBefore)
			for _, i := range order {
				steps[i].do(t, r)
			}
			shared(before, after)(t, r) // a gap left by the order is filled
			got := fmt.Sprint(names2(rows(t, r, ModelTag), "canonical_name"), names2(rows(t, r, ModelAuditLog), "action"))
			if got != "[before] [before]" {
				t.Fatalf("after %v: %s", names, got)
			}
			if want == "" {
				want = got
			}
			if rv, ok := r.Revoked(devC); !ok || rv.By != devA || rv.Reason != "stolen" {
				t.Fatalf("revocation: %+v %v", rv, ok)
			}
			// What C writes later is refused and counted as revoked.
			res := shared(after)(t, r)
			if res.Applied != 0 {
				t.Fatalf("C's change applied again: %+v", res)
			}
			res = state(auditAfter)(t, r)
			if len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonRevoked {
				t.Fatalf("C's row after the revocation: %+v", res)
			}
			// Reopened, the decision holds (decided before the replay).
			r = reopen(t, r, Options{Self: devR})
			if _, ok := r.Revoked(devC); !ok {
				t.Fatal("the revocation was forgotten at open")
			}
		})
	}
}

// With remove_rows, every device-owned row of the revoked device goes
// (its device row stays, for its name), and none is taken again.
func TestRevocationRemovesRows(t *testing.T) {
	c := newLib(t, devC)
	a := newLib(t, devA)
	devRow, _, _ := c.WriteState(ModelDevice, messages.UUID(devC), map[string]any{"name": "phone"})
	audit, _, err := c.WriteState(ModelAuditLog, uid(1), map[string]any{"action": "x"})
	if err != nil {
		t.Fatal(err)
	}
	aRow, _, _ := a.WriteState(ModelDevice, messages.UUID(devA), map[string]any{"name": "laptop"})
	r := newLib(t, devR)
	mustApply(t, r, devC, ModelDevice, devRow)
	mustApply(t, r, devA, ModelDevice, aRow)
	mustApply(t, r, devC, ModelAuditLog, audit)
	rv, _, err := a.CommitShared(ModelRevocation, messages.UUID{}, messages.OpInsert, revokeFields(devC, devA, true))
	if err != nil {
		t.Fatal(err)
	}
	applyChain(t, r, rv)
	if n := len(rows(t, r, ModelAuditLog)); n != 0 {
		t.Fatalf("%d audit rows of the revoked device stay", n)
	}
	if n := len(rows(t, r, ModelDevice)); n != 3 {
		t.Fatalf("%d device rows, want R's, A's and C's", n)
	}
	res, err := r.ApplyState(devC, ModelAuditLog, []messages.StateRecord{audit}, ApplyOptions{})
	if err != nil || len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonRevoked {
		t.Fatalf("a row of C before the revocation came back: %+v %v", res, err)
	}
	mustVerify(t, r)
}

// Forged revocation rows are refused as bad signatures: unsigned, in
// another member's name, signed by another key, and a device's "own"
// revocation written by a third device.
func TestForgedRevocationRefused(t *testing.T) {
	r := newLib(t, devR)
	bc := messages.NewClock(devB.UUID(), nil, 0)
	prev := messages.HLC{}
	forge := func(f map[string]any, key messages.DeviceID, alter func(c *messages.SharedChange)) ApplyResult {
		t.Helper()
		h := bc.Now()
		u, _ := r.Registry().DeterministicUUID(ModelRevocation, f)
		sig, err := r.Registry().SignRow(testLibID, ModelRevocation, u, h, f, testKey(key))
		if err != nil {
			t.Fatal(err)
		}
		f["sig"] = sig
		c := messages.SharedChange{HLC: h, Prev: prev, Model: ModelRevocation, Record: u, Op: messages.OpInsert, Fields: f}
		alter(&c)
		prev = c.HLC
		res, err := r.ApplyShared([]messages.SharedChange{c}, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for name, tc := range map[string]struct {
		f     map[string]any
		key   messages.DeviceID
		alter func(*messages.SharedChange)
	}{
		"unsigned":                     {revokeFields(devC, devB, false), devB, func(c *messages.SharedChange) { delete(c.Fields, "sig") }},
		"in A's name":                  {revokeFields(devC, devA, false), devA, func(*messages.SharedChange) {}},
		"signed by A's key":            {revokeFields(devC, devB, false), devA, func(*messages.SharedChange) {}},
		"C's own, written by B":        {revokeFields(devC, devC, false), devC, func(*messages.SharedChange) {}},
		"C's own, B signs in C's name": {revokeFields(devC, devC, false), devB, func(*messages.SharedChange) {}},
	} {
		res := forge(tc.f, tc.key, tc.alter)
		if len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonBadSignature {
			t.Fatalf("%s: %+v", name, res)
		}
	}
	if counted, _ := r.Revocations(); len(counted) != 0 {
		t.Fatalf("a forged revocation counts: %+v", counted)
	}
	// B is no member here (no device row): its genuine revocation is
	// kept but does not count.
	res := forge(revokeFields(devC, devB, false), devB, func(*messages.SharedChange) {})
	if res.Applied != 1 {
		t.Fatalf("B's genuine row: %+v", res)
	}
	counted, refused := r.Revocations()
	if len(counted) != 0 || len(refused) != 1 {
		t.Fatalf("a non-member's revocation: counted %+v refused %+v", counted, refused)
	}
	// Once B's device row arrives (B is a member after all), it counts.
	mustApply(t, r, devB, ModelDevice, recordFor(t, ModelDevice, messages.UUID(devB), hlcAt(1, 0, devB), map[string]any{"name": "B"}))
	if counted, _ := r.Revocations(); len(counted) != 1 || counted[0].Device != devC {
		t.Fatalf("B's revocation after B's device row: %+v", counted)
	}
}

func names2(rs []Row, col string) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprint(r[col]))
	}
	slices.Sort(out)
	return out
}
