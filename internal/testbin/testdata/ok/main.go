// Package main is the smallest program testbin's tests build.
package main

import "fmt"

func main() { fmt.Println("built") }
