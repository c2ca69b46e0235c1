// Package main does not compile on purpose: testbin's tests build it.
package main

func main() {
	var n int = "not a number"
	_ = n
}
