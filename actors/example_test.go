package actors_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Two devices in one process, over real QUIC on loopback: pair them with a
// one-time code, share a library, write on one, read on the other.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func(name string) *actors.Node {
		home, _ := os.MkdirTemp("", "lsync-example-")
		node, err := actors.Start(ctx, actors.Config{Home: home, Name: name, Listen: "127.0.0.1:0"})
		if err != nil {
			panic(err)
		}
		return node
	}
	laptop, phone := start("laptop"), start("phone")
	defer laptop.Stop(context.Background())
	defer phone.Stop(context.Background())

	// Pair: the laptop shows a code, the phone enters it.
	code, err := laptop.GeneratePairingCode(0, 0)
	if err != nil {
		panic(err)
	}
	if _, err := phone.JoinPairing(ctx, code.Code, laptop.Addr()); err != nil {
		panic(err)
	}

	// Share a library: the phone registers with the laptop and joins.
	lib, _ := laptop.CreateLibrary(ctx, "Family photos")
	_ = phone.WaitConnected(ctx, laptop.ID())
	mine, err := phone.SyncSetup(ctx, laptop.ID(), lib.ID(), actors.ActionJoin)
	if err != nil {
		panic(err)
	}

	// Write on the laptop; the phone sees it. Every change that reaches
	// the phone (by its join, live, or a catch-up) comes with an event.
	events, stop := mine.Events()
	defer stop()
	if _, err := lib.AddLocation(ctx, "/home/jamie/Pictures", "Pictures", messages.UUID{}); err != nil {
		panic(err)
	}
	rows, _ := mine.Query(ctx, persistence.ModelLocation)
	for len(rows) == 0 {
		<-events
		rows, _ = mine.Query(ctx, persistence.ModelLocation)
	}
	fmt.Println("phone sees", rows[0]["path"], "owned by the laptop:", rows[0]["device_uuid"] == laptop.ID().String())
	// Output: phone sees /home/jamie/Pictures owned by the laptop: true
}
