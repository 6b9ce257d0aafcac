// Command shout is a binary of its own built on proxycmd and replicacmd,
// as the README shows: it registers a handler kind, "shout", and serves it
// as the proxy (shout [flags]) or as a replica host (shout replica [flags]).
// The tests in cmd/proxy build and run it.
package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/serveproxy/serveproxy/cmd/proxy/proxycmd"
	"github.com/serveproxy/serveproxy/cmd/replica/replicacmd"
	"github.com/serveproxy/serveproxy/replica"
)

func main() {
	reg := replica.NewRegistry()
	reg.MustRegister("shout", newShout)
	if len(os.Args) > 1 && os.Args[1] == "replica" {
		os.Args = append(os.Args[:1], os.Args[2:]...)
		os.Exit(replicacmd.Main(reg))
	}
	os.Exit(proxycmd.Main(reg))
}

// newShout builds one replica: it answers its user_config's word in
// capitals, then the path.
func newShout(userConfig json.RawMessage) (replica.Handler, error) {
	var c struct {
		Word string `json:"word"`
	}
	if len(userConfig) > 0 {
		if err := json.Unmarshal(userConfig, &c); err != nil {
			return nil, err
		}
	}
	word := strings.ToUpper(c.Word)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, word+r.URL.Path)
	}), nil
}
