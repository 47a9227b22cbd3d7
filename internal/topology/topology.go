// Package topology lays out the groups the 50-member simulation
// (actors/members_test.go) and the members-N bench scenario (bench/)
// build, so that the same seed gives both the same graph.
package topology

import "math/rand/v2"

// Sparse is a random graph of n devices in which each has three or four
// partners: a random tree in which no device takes a fifth partner
// (tree[k-1] = (k, the device k joins through), k = 1..n-1), plus random
// extra edges until every device has three, or no device with room is
// left.
func Sparse(n int, seed uint64) (tree, extra [][2]int) {
	rnd := rand.New(rand.NewPCG(seed, 0x5ba25e))
	deg := make([]int, n)
	has := map[[2]int]bool{}
	link := func(a, b int) {
		has[[2]int{a, b}], has[[2]int{b, a}] = true, true
		deg[a]++
		deg[b]++
	}
	for k := 1; k < n; k++ {
		var room []int
		for j := range k {
			if deg[j] < 4 {
				room = append(room, j)
			}
		}
		j := room[rnd.IntN(len(room))]
		link(k, j)
		tree = append(tree, [2]int{k, j})
	}
	for a := range n {
		for try := 0; deg[a] < 3 && try < 100; try++ {
			if b := rnd.IntN(n); b != a && !has[[2]int{a, b}] && deg[b] < 4 {
				link(a, b)
				extra = append(extra, [2]int{a, b})
			}
		}
	}
	return tree, extra
}
