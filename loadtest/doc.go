// Package loadtest is the project's HTTP load generator and the harnesses
// behind every speed claim.
//
// Run drives one load against one URL, either closed loop like ab and hey
// (Concurrency workers, each sending its next request when the previous one
// is answered) or open loop at a fixed Rate (requests scheduled at intended
// send times, latency measured from those times so a slow server cannot hide
// its queueing: no coordinated omission). Latencies go into an HDR histogram;
// the Result prints in ab's shape (WriteText, which ParseText reads back, as
// it reads ab's own output) or as JSON (WriteJSON).
//
// Compare runs the same load against several targets side by side, the order
// rotated each round, and reports medians; GCCompare starts the proxy binary
// under several GC settings and reports throughput, latency, GC cycles and
// peak memory for each, its closed loops driven by wrk (RunWrk) or by Run;
// Soak holds the proxy under a steady open loop for minutes, sampling its
// memory and goroutines, and says whether they stayed flat. Load only ever
// goes to loopback addresses unless a caller says otherwise
// (Config.AllowRemote).
package loadtest
