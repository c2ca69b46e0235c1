package sweep

import (
	"fmt"
	"strings"
)

// chatPrompts are the chat split's prompts: short (about 45 tokens, like the
// first field report's), open-ended so no answer ends before max_tokens on an engine
// that ignores ignore_eos. Fixed, so every machine gets the same requests.
var chatPrompts = []string{
	"Explain in detail how a hash map handles collisions, compare open addressing with separate chaining, and give an example of when each one is the better choice in practice.",
	"Write a short story about a lighthouse keeper who discovers that the light has been signalling to someone far out at sea, and describe what happens on the night they answer.",
	"Describe step by step how a web browser loads a page, from typing the address to the first paint, including DNS, TCP, TLS, HTTP and the rendering pipeline.",
	"Compare the trade-offs of microservices and a modular monolith for a team of eight engineers building an online shop, covering deployment, testing, data ownership and cost.",
	"Explain how photosynthesis turns light into chemical energy, covering the light-dependent reactions, the Calvin cycle and why leaves change colour in autumn.",
	"Write a detailed guide to brewing a good cup of pour-over coffee at home, covering the grind, the water temperature, the bloom and the common mistakes beginners make.",
	"Describe the causes and the consequences of the fall of the Western Roman Empire, weighing economic, military and political explanations that historians have offered.",
	"Explain how a garbage collector decides what memory to free, comparing reference counting, mark and sweep, and generational collection with their pauses and overheads.",
}

// agentWords build the agent split's long context: code-review prose that
// tokenises at roughly 1.3 tokens a word.
var agentWords = strings.Fields(`the function handler returns an error when the request context is cancelled before
the upstream worker answers so the caller retries on another node and records the latency sample in the
store while the scheduler updates its speed curve for that worker and the queue drains in order of arrival
each file in the repository declares its package and imports then defines types with methods that validate
input and wrap errors with context for the operator who reads the log line and decides what to do next`)

// agentContextWords, with the tool-output markers between them, make about
// 3,500 words: about 4.6K prompt tokens.
const agentContextWords = 3200

// firstTurn is the messages of a session's first request.
func firstTurn(split string, i int) []map[string]string {
	return []map[string]string{{"role": "user", "content": prompt(split, i)}}
}

// toolResultWords is about 500 tokens of a tool's output.
const toolResultWords = 380

// toolResult is what a session's turn adds after the previous answer: a
// tool's output, distinct per session and turn.
func toolResult(session, turn int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "[tool output, turn %d of session %d]\n", turn, session)
	for w := range toolResultWords {
		if w > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(agentWords[(w*5+session+turn)%len(agentWords)])
	}
	sb.WriteString("\n\nWhat next?")
	return sb.String()
}

// prompt returns the i-th request's prompt for a split. Agent prompts start
// with a distinct header, so no engine can serve one from another's prefix
// cache and TTFT measures a real prefill of the whole context.
func prompt(split string, i int) string {
	if i < 0 {
		i = -i
	}
	if split != SplitAgent {
		return chatPrompts[i%len(chatPrompts)]
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Session %d. You are a coding agent. Below is the context gathered by your tools.\n\n", i)
	for w := range agentContextWords {
		if w > 0 {
			if w%24 == 0 {
				fmt.Fprintf(&sb, ".\n[tool output %d.%d] ", i, w/24)
			} else {
				sb.WriteByte(' ')
			}
		}
		sb.WriteString(agentWords[(w*7+i)%len(agentWords)])
	}
	sb.WriteString(".\n\nIn one short paragraph, say which function to change first and why.")
	return sb.String()
}
