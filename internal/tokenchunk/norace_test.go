//go:build !race

package tokenchunk

const raceDetector = false
