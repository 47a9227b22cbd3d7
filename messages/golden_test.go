package messages

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/golden_frames.txt from the current encoder")

// goldenMessages are the frames pinned byte for byte: one sample of every
// type, and one batch large enough to be compressed.
func goldenMessages() []Message {
	ms := sampleMessages()
	var recs []StateRecord
	for i := range 400 {
		recs = append(recs, StateRecord{
			UUID:   UUID(uuid.NewSHA1(uuid.Nil, []byte{byte(i), byte(i >> 8)})),
			HLC:    HLC{Timestamp: uint64(1_730_000_000_000 + i), Device: devA},
			Values: []any{fmt.Sprintf("/photos/2024/img_%04d.jpg", i), int64(i) * 4096},
		})
	}
	return append(ms, &StateBatch{Model: "entry", Owner: DeviceID(devA), Records: recs})
}

// TestGoldenFrames pins the wire: every frame this build encodes for the
// golden messages must equal, byte for byte, the one recorded in
// testdata/golden_frames.txt, and the recorded frames must decode. A
// refactoring of the codec must not change a byte. The compressed frame
// also pins the zstd encoder's output; if a new klauspost/compress release
// changes it (legitimate: any zstd decoder reads both), check that the
// old frame still decodes, then run the test with -update.
func TestGoldenFrames(t *testing.T) {
	path := filepath.Join("testdata", "golden_frames.txt")
	var got bytes.Buffer
	compressed := false
	for _, m := range goldenMessages() {
		frame, env, _ := roundTrip(t, m)
		compressed = compressed || env.Flags&FlagZstd != 0
		fmt.Fprintf(&got, "%s %s\n", m.MessageType(), hex.EncodeToString(frame))
	}
	if !compressed {
		t.Fatal("no golden frame is compressed")
	}
	if *updateGolden {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Every recorded frame still decodes to a message of its type.
	sc := bufio.NewScanner(bytes.NewReader(want))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, hx, _ := strings.Cut(sc.Text(), " ")
		frame, err := hex.DecodeString(hx)
		if err != nil {
			t.Fatal(err)
		}
		if _, m, err := DecodeFrame(frame, 0); err != nil || m.MessageType().String() != name {
			t.Errorf("recorded %s frame: %T, %v", name, m, err)
		}
	}
	gotLines, wantLines := strings.Split(got.String(), "\n"), strings.Split(string(want), "\n")
	if len(gotLines) != len(wantLines) {
		t.Fatalf("%d frames encoded, %d recorded", len(gotLines)-1, len(wantLines)-1)
	}
	for i := range gotLines {
		if gotLines[i] != wantLines[i] {
			name, _, _ := strings.Cut(wantLines[i], " ")
			t.Errorf("frame %d (%s) differs from the recorded one", i, name)
		}
	}
}
