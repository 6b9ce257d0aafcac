// Command proxy is serveproxy's binary: with no configuration it serves
// Serve's benchmark app (16 replicas answering "hi" at /); with -config it
// serves the applications of a Serve-shaped YAML file. Its flags and
// behaviour are those of package proxycmd; a binary of your own that
// registers more handler kinds calls proxycmd.Main the same way.
package main

import (
	"os"

	"github.com/serveproxy/serveproxy/cmd/proxy/proxycmd"
	"github.com/serveproxy/serveproxy/replica"
)

func main() {
	os.Exit(proxycmd.Main(replica.NewRegistry()))
}
