package leases

import (
	"testing"
)

// An endpoint's limit divided among the partitions: whatever replica holds which partitions,
// the holders' shares add up to the limit exactly, and with the partitions spread evenly over
// R replicas (p mod R, as Run spreads them, R dividing 12) each share is within one
// partition's part of limit/R. A limit below the number of partitions lives on the endpoint's own partition and
// the ones after it: a limit of 1 is the holder of its partition's alone.
func TestShareOfDividesTheLimit(t *testing.T) {
	const n = 12
	for _, ep := range []string{"orders", "a", "billing.v2"} {
		for limit := 0; limit <= 40; limit++ {
			for _, replicas := range []int{1, 2, 3, 4, 5, 6} {
				total := 0
				for r := range replicas {
					share := ShareOf(ep, n, limit, func(p int) bool { return p%replicas == r })
					total += share
					part := (limit + n - 1) / n
					if lo, hi := limit/replicas-part, limit/replicas+part; n%replicas == 0 && (share < lo || share > hi) {
						t.Errorf("%s, limit %d, replica %d of %d: share %d, want within [%d, %d]", ep, limit, r, replicas, share, lo, hi)
					}
				}
				if total != limit {
					t.Errorf("%s, limit %d, %d replicas: shares add up to %d", ep, limit, replicas, total)
				}
			}
		}
		own := PartitionOf(ep, n)
		if got := ShareOf(ep, n, 1, func(p int) bool { return p == own }); got != 1 {
			t.Errorf("%s: a limit of 1 is not its own partition's (%d)", ep, got)
		}
		for p := range n {
			covered := ShareOf(ep, n, 3, func(q int) bool { return q == p }) > 0
			if want := (p-own+n)%n < 3; covered != want {
				t.Errorf("%s, limit 3: partition %d has a part: %v, want %v", ep, p, covered, want)
			}
		}
	}
	if got := ShareOf("x", 1, 7, func(int) bool { return true }); got != 7 {
		t.Errorf("one partition: share %d, want the whole limit", got)
	}
}
