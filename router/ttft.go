package router

import (
	"bytes"
	"strconv"
	"time"
)

var promptMsField = []byte(`"prompt_ms":`)

// promptTime reads the engine's own prefill time from the end of a
// non-streamed answer: llama-server's timings.prompt_ms.
func promptTime(tail []byte) (time.Duration, bool) {
	i := lastIndex(tail, promptMsField)
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(tail[i+len(promptMsField):], " ")
	n := 0
	for n < len(rest) && (rest[n] == '.' || rest[n] == '-' || rest[n] == '+' || rest[n] == 'e' || rest[n] == 'E' || (rest[n] >= '0' && rest[n] <= '9')) {
		n++
	}
	v, err := strconv.ParseFloat(string(rest[:n]), 64)
	if err != nil || v <= 0 {
		return 0, false
	}
	return time.Duration(v * float64(time.Millisecond)), true
}
