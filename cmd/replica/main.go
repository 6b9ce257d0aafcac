// Command replica is a replica host: it runs K actors of one registered
// handler in this process and serves them to proxies over the replica-host
// protocol. Its flags and behaviour are those of package replicacmd; a
// binary of your own that registers more handlers calls replicacmd.Main
// the same way.
package main

import (
	"os"

	"github.com/serveproxy/serveproxy/cmd/replica/replicacmd"
	"github.com/serveproxy/serveproxy/replica"
)

func main() {
	os.Exit(replicacmd.Main(replica.NewRegistry()))
}
