package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lsync/lsync/internal/topology"
)

// membersPrefix names the members-N scenarios: N real daemons, one library.
const membersPrefix = "members-"

// membersMax bounds N: every member is a daemon and an `lsync watch`
// process of its own.
const membersMax = 200

var membersTopologies = []string{"sparse", "chain", "star", "mesh"}

// parseMembersScenario reads N of "members-N". ok is false for a name
// that is not a members scenario at all; err says what is wrong with one
// that is (N not a number, below 3, above membersMax).
func parseMembersScenario(name string) (n int, ok bool, err error) {
	rest, found := strings.CutPrefix(name, membersPrefix)
	if !found {
		return 0, false, nil
	}
	n, err = strconv.Atoi(rest)
	if err != nil || n < 3 || n > membersMax {
		return 0, true, fmt.Errorf("--scenarios %s: want members-N with N a whole number from 3 to %d (members-10, members-50)", name, membersMax)
	}
	return n, true, nil
}

func isMembersScenario(name string) bool {
	_, ok, err := parseMembersScenario(name)
	return ok && err == nil
}

// memberTopology is who is paired with whom, and how each device but
// device 0 (which creates the library) becomes a member.
type memberTopology struct {
	kind  string
	n     int
	edges [][2]int // paired devices, a < b: partners once both are members
	// joins are the sync-setups in order, grouped by breadth-first level
	// from device 0: joins[l] are (joiner, via) pairs whose via is a
	// member once the levels before l have joined; via is a neighbour
	// of joiner.
	joins [][][2]int
}

// newMemberTopology lays out n devices, as the simulation does
// (newMemberTopology in actors/members_test.go; the same seed gives the
// same sparse graph): a mesh pairs everyone, a star pairs device 0 with
// each other one, a chain pairs k with k+1, and a sparse graph is a
// random tree in which no device takes a fifth partner, plus random
// edges until every device has three (or no device with room is left),
// so each device has three or four.
func newMemberTopology(kind string, n int, seed uint64) (memberTopology, error) {
	top := memberTopology{kind: kind, n: n}
	add := func(a, b int) {
		top.edges = append(top.edges, [2]int{min(a, b), max(a, b)})
	}
	switch kind {
	case "mesh":
		for i := range n {
			for j := i + 1; j < n; j++ {
				add(i, j)
			}
		}
	case "star":
		for k := 1; k < n; k++ {
			add(0, k)
		}
	case "chain":
		for k := 1; k < n; k++ {
			add(k-1, k)
		}
	case "sparse":
		tree, extra := topology.Sparse(n, seed)
		for _, e := range append(tree, extra...) {
			add(e[0], e[1])
		}
	default:
		return top, fmt.Errorf("--members-topology %q: want %s", kind, strings.Join(membersTopologies, ", "))
	}
	top.joins = bfsJoins(n, top.neighbours())
	return top, nil
}

// neighbours lists each device's paired devices, in ascending order.
func (t memberTopology) neighbours() [][]int {
	nb := make([][]int, t.n)
	for _, e := range t.edges {
		nb[e[0]] = append(nb[e[0]], e[1])
		nb[e[1]] = append(nb[e[1]], e[0])
	}
	for _, s := range nb {
		slices.Sort(s)
	}
	return nb
}

// bfsJoins orders the joins breadth first from device 0: a device joins
// through the neighbour that first reached it, one level after it.
func bfsJoins(n int, nb [][]int) [][][2]int {
	seen := make([]bool, n)
	seen[0] = true
	var levels [][][2]int
	frontier := []int{0}
	for len(frontier) > 0 {
		var level [][2]int
		var next []int
		for _, via := range frontier {
			for _, k := range nb[via] {
				if !seen[k] {
					seen[k] = true
					level = append(level, [2]int{k, via})
					next = append(next, k)
				}
			}
		}
		if len(level) > 0 {
			levels = append(levels, level)
		}
		frontier = next
	}
	return levels
}

// degrees are the fewest and most partners of a device.
func (t memberTopology) degrees() (lo, hi int) {
	lo = t.n
	for _, s := range t.neighbours() {
		lo, hi = min(lo, len(s)), max(hi, len(s))
	}
	return lo, hi
}

// pairingRounds splits the edges into rounds in which no device pairs
// twice (a greedy edge colouring): a round's pairings can run at once,
// each device with one pairing code pending.
func (t memberTopology) pairingRounds() [][][2]int {
	var rounds [][][2]int
	var busy []map[int]bool
	for _, e := range t.edges {
		r := 0
		for r < len(rounds) && (busy[r][e[0]] || busy[r][e[1]]) {
			r++
		}
		if r == len(rounds) {
			rounds = append(rounds, nil)
			busy = append(busy, map[int]bool{})
		}
		rounds[r] = append(rounds[r], e)
		busy[r][e[0]], busy[r][e[1]] = true, true
	}
	return rounds
}
