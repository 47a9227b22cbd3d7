package actors

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// A partner that sends device-owned state it does not own is refused:
// claiming another owner outright, or claiming as its own a row another
// device owns. Both are counted and change nothing.
func TestForgedStateChangeRefused(t *testing.T) { bubble(t, testForgedStateChangeRefused) }

func testForgedStateChangeRefused(t *testing.T) {
	c := newCluster(t, 3, 13)
	c.share()
	ctx := ctxT(t)
	loc, err := c.libs[1].AddLocation(ctx, "/b/photos", "photos", messages.UUID{})
	if err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	lib := c.libs[0].ID()
	conn := impostor(t, c, 2)
	reg := c.libs[0].Store().Registry()
	values, err := reg.EncodeValues("location", map[string]any{"path": "/evil", "name": "evil"})
	if err != nil {
		t.Fatal(err)
	}
	h := messages.HLC{Timestamp: uint64(time.Now().UnixMilli()), Device: c.devs[2].UUID()}
	metrics := c.nodes[0].Metrics()
	before := metrics.RejectedCount(messages.ReasonForgedOwner)

	// 1. Claims to be device 1's write (sender is not the owner).
	forged := persistence.NewUUID()
	send(t, conn, lib, &messages.StateChange{Model: "location", Owner: c.devs[1], Record: messages.StateRecord{UUID: forged, HLC: h, Values: values}})
	// 2. Claims device 1's existing location as its own.
	h.Counter++
	send(t, conn, lib, &messages.StateChange{Model: "location", Owner: c.devs[2], Record: messages.StateRecord{UUID: loc, HLC: h, Values: values}})
	// 3. Deletes device 1's location in device 1's name.
	h.Counter++
	send(t, conn, lib, &messages.StateDelete{Model: "location", Owner: c.devs[1], UUID: loc, HLC: h})

	testutil.Eventually(t, 5*time.Second, "three forged_owner rejections", func() bool {
		return metrics.RejectedCount(messages.ReasonForgedOwner)-before >= 3
	})
	rows := c.rows(0, "location")
	if len(rows) != 1 || rows[0]["uuid"] != loc.String() || rows[0]["path"] != "/b/photos" || rows[0]["device_uuid"] != c.devs[1].String() {
		t.Fatalf("forged changes altered the locations: %v", rows)
	}
}

// impostor stops device i's node and returns a raw connection with its
// identity to device 0: a partner that sends whatever the test writes.
func impostor(t *testing.T, c *cluster, i int) net.Conn {
	t.Helper()
	c.stopNode(i)
	raw, err := c.net.Listen(c.devs[i], "impostor", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	conn, err := raw.Dial(ctxT(t), c.devs[0], c.dir[c.devs[0]])
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// answerImpostor answers the requests an impostor's connection receives
// until it closes: with serve's answer, or (serve nil, or its answer nil)
// as a peer that holds nothing, so catch-ups of it end at once.
func answerImpostor(ctx context.Context, conn net.Conn, serve func(messages.Message) messages.Message) {
	for {
		in, err := conn.Recv(ctx)
		if err != nil {
			return
		}
		if in.Reply == nil {
			continue
		}
		if serve != nil {
			if resp := serve(in.Message); resp != nil {
				_ = in.Reply(resp)
				continue
			}
		}
		switch r := in.Message.(type) {
		case *messages.StateOwnersRequest:
			_ = in.Reply(&messages.StateOwnersResponse{})
		case *messages.StateRequest:
			_ = in.Reply(&messages.StateResponse{Owner: r.Owner})
		case *messages.SharedChangeRequest:
			_ = in.Reply(&messages.SharedChangeResponse{Origin: r.Origin})
		case *messages.SharedStateRequest:
			_ = in.Reply(&messages.SharedStateResponse{})
		default:
			_ = in.Reply(&messages.Error{Code: messages.CodeNotFound, Message: "no"})
		}
	}
}

func send(t *testing.T, conn interface {
	Send(context.Context, messages.LibraryID, messages.Message) error
}, lib messages.LibraryID, m messages.Message) {
	t.Helper()
	if err := conn.Send(context.Background(), lib, m); err != nil {
		t.Fatal(err)
	}
}

// A non-partner (paired, but not a partner of this library) is refused.
func TestNonPartnerRefused(t *testing.T) { bubble(t, testNonPartnerRefused) }

func testNonPartnerRefused(t *testing.T) {
	c := newCluster(t, 2, 14)
	ctx := ctxT(t)
	lib, err := c.nodes[0].CreateLibrary(ctx, "private")
	if err != nil {
		t.Fatal(err)
	}
	c.libs[0] = lib
	if err := c.nodes[1].WaitConnected(ctx, c.devs[0]); err != nil {
		t.Fatal(err)
	}
	before := c.nodes[0].Metrics().RejectedCount("unauthorized")
	conn, err := c.nodes[1].conn(ctx, c.devs[0])
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Request(ctx, lib.ID(), &messages.StateRequest{Owner: c.devs[0], Limit: 10})
	if err == nil {
		t.Fatal("a non-partner read the library")
	}
	var me *messages.Error
	if !errors.As(err, &me) || me.Code != messages.CodeUnauthorized {
		t.Fatalf("want an unauthorized error, got %v", err)
	}
	if c.nodes[0].Metrics().RejectedCount("unauthorized") <= before {
		t.Fatal("refusal not counted")
	}
}

// Clock skew: a partner whose HLC is far in the future is refused and the
// clock of the receiver is left alone.
func TestSkewedChangeRefused(t *testing.T) { bubble(t, testSkewedChangeRefused) }

func testSkewedChangeRefused(t *testing.T) {
	c := newCluster(t, 3, 15)
	c.share()
	c.converge(true, 10*time.Second)
	lib := c.libs[0].ID()
	conn := impostor(t, c, 2)
	values, _ := c.libs[0].Store().Registry().EncodeValues("location", map[string]any{"path": "/future", "name": "f"})
	future := messages.HLC{Timestamp: uint64(time.Now().Add(24 * time.Hour).UnixMilli()), Device: c.devs[2].UUID()}
	before := c.nodes[0].Metrics().RejectedCount("clock_skew")
	send(t, conn, lib, &messages.StateChange{Model: "location", Owner: c.devs[2], Record: messages.StateRecord{UUID: persistence.NewUUID(), HLC: future, Values: values}})
	testutil.Eventually(t, 5*time.Second, "a clock_skew rejection", func() bool {
		return c.nodes[0].Metrics().RejectedCount("clock_skew") > before
	})
	if n := len(c.rows(0, "location")); n != 0 {
		t.Fatalf("skewed change applied (%d locations)", n)
	}
	if now := c.libs[0].Store().Clock().Now(); now.Timestamp >= future.Timestamp {
		t.Fatal("the receiver's clock was dragged into the future")
	}
}
