package benchproc

import "slices"

// Median of xs (the upper middle of an even count); xs is left unsorted.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
