package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reloadConfig is the file of TestReload, with the static app's body and
// replicas, the upstreams and an extra line for the hello deployment.
func reloadConfig(body string, replicas int, upstreams []string, extra string) string {
	var ups []string
	for _, u := range upstreams {
		ups = append(ups, `"http://`+u+`"`)
	}
	return `applications:
  - name: hello
    route_prefix: /hello
    deployments:
      - name: hello
        handler: static
        num_replicas: ` + itoa(replicas) + `
        user_config: {body: ` + body + `}
` + extra + `  - name: up
    route_prefix: /up
    deployments:
      - name: up
        handler: upstream
        upstreams: [` + strings.Join(ups, ", ") + `]
        health_check_path: /
`
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// reloadResult is POST /-/reload's answer.
type reloadResult struct {
	Applied  []string `json:"applied"`
	Partial  []string `json:"partial"`
	Problems []string `json:"problems"`
	Failed   []string `json:"failed"`
	Warnings []string `json:"warnings"`
}

func postReload(t *testing.T, c *http.Client, p *proc) (int, reloadResult) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+p.AdminAddr+"/-/reload", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := do(t, c, req)
	var res reloadResult
	if err := json.Unmarshal([]byte(r.body), &res); err != nil {
		t.Fatalf("POST /-/reload: %d %q: %v", r.status, r.body, err)
	}
	return r.status, res
}

func TestReload(t *testing.T) {
	h1, h2 := startHi(t), startHi(t)
	path := writeConfig(t, reloadConfig("one", 1, []string{h1.addr}, ""))
	rewrite := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	counts := func() (hello, up int) {
		apps := getApplications(t, c, p).Applications
		for _, rep := range apps[0].Deployments[0].Replicas {
			if rep.State == "RUNNING" {
				hello++
			}
		}
		return hello, len(apps[1].Deployments[0].Replicas)
	}

	// SIGHUP: the light changes are made in place.
	rewrite(reloadConfig("two", 3, []string{h1.addr, h2.addr}, ""))
	p.signal(syscall.SIGHUP)
	if !p.waitLogged(`"message":"config reloaded"`, 30*time.Second) {
		t.Fatalf("no reload logged after SIGHUP:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	if r := get(t, c, "http://"+p.HTTPAddr+"/hello"); r.body != "two" {
		t.Errorf("after the reload /hello = %d %q, want the new user_config's body", r.status, r.body)
	}
	waitUntil(t, "3 hello replicas and 2 upstreams", func() bool { h, u := counts(); return h == 3 && u == 2 })

	// It is declarative: a scale through the admin API is undone by a
	// reload of the file, which still says 3.
	req, _ := http.NewRequest(http.MethodPut, "http://"+p.AdminAddr+"/-/applications/hello/deployments/hello/num_replicas", strings.NewReader(`{"num_replicas": 1}`))
	if r := do(t, c, req); r.status != http.StatusOK {
		t.Fatalf("PUT num_replicas: %d %s", r.status, r.body)
	}
	status, res := postReload(t, c, p)
	if status != http.StatusOK || len(res.Applied) != 1 || !strings.Contains(res.Applied[0], "num_replicas from 1 to 3") {
		t.Errorf("reload after an admin scale: %d %+v, want num_replicas from 1 to 3 applied", status, res)
	}
	status, res = postReload(t, c, p)
	if status != http.StatusOK || len(res.Applied) != 0 {
		t.Errorf("reload of an unchanged file: %d %+v, want 200 and nothing applied", status, res)
	}
	rewrite(reloadConfig("two", 3, []string{h2.addr + "/", h1.addr}, "")) // the same upstreams
	status, res = postReload(t, c, p)
	if status != http.StatusOK || len(res.Applied) != 0 {
		t.Errorf("reload with the upstreams reordered: %d %+v, want 200 and nothing applied", status, res)
	}
	// Another upstream leaving keeps the replica of the one that stays,
	// however its URL ends.
	upIDs := func() map[string]string {
		ids := map[string]string{}
		for _, rep := range getApplications(t, c, p).Applications[1].Deployments[0].Replicas {
			ids[strings.TrimRight(rep.Target, "/")] = rep.ID
		}
		return ids
	}
	before := upIDs()
	rewrite(reloadConfig("two", 3, []string{h2.addr + "/"}, ""))
	if status, res = postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 1 {
		t.Errorf("reload dropping an upstream: %d %+v", status, res)
	}
	// The dropped one is listed until its drain is done, which may take
	// a moment after the reload answered.
	var after map[string]string
	waitUntil(t, "the dropped upstream's replica drained", func() bool { after = upIDs(); return len(after) == 1 })
	if after["http://"+h2.addr] != before["http://"+h2.addr] {
		t.Errorf("upstream replicas %v after dropping the other, want %s's kept from %v", after, h2.addr, before)
	}
	rewrite(reloadConfig("two", 3, []string{h2.addr + "/", h1.addr}, ""))
	if status, res = postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 1 {
		t.Errorf("reload adding the upstream back: %d %+v", status, res)
	}

	// Health checks and the grace change live, as Serve's light updates
	// do (they took a restart, found by a tester).
	rewrite(reloadConfig("two", 3, []string{h2.addr + "/", h1.addr}, "        health_check_period_s: 5\n        health_check_timeout_s: 7\n        graceful_shutdown_timeout_s: 3\n"))
	if status, res = postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 2 ||
		!strings.Contains(res.Applied[0], "health_check_period_s from 10 to 5, health_check_timeout_s from 30 to 7") ||
		!strings.Contains(res.Applied[1], "graceful_shutdown_timeout_s from 20 to 3") {
		t.Errorf("reload of the health checks and the grace: %d %+v, want 200 with them applied", status, res)
	}
	if d := getApplications(t, c, p).Applications[0].Deployments[0]; d.HealthS != 5 || d.HealthTO != 7 || d.GraceS != 3 {
		t.Errorf("GET /-/applications after the reload: period %v, timeout %v, grace %v; want 5, 7, 3", d.HealthS, d.HealthTO, d.GraceS)
	}

	// max_ongoing_requests too (it took a restart).
	rewrite(reloadConfig("two", 3, []string{h2.addr + "/", h1.addr}, "        health_check_period_s: 5\n        health_check_timeout_s: 7\n        graceful_shutdown_timeout_s: 3\n        max_ongoing_requests: 10\n"))
	if status, res = postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 1 ||
		!strings.Contains(res.Applied[0], "max_ongoing_requests from 5 to 10") {
		t.Errorf("reload of max_ongoing_requests: %d %+v, want 200 with it applied", status, res)
	}
	if d := getApplications(t, c, p).Applications[0].Deployments[0]; d.MaxOngoing != 10 {
		t.Errorf("GET /-/applications after the reload: max_ongoing_requests %d, want 10", d.MaxOngoing)
	}

	// A change that takes a restart: refused, nothing changed.
	rewrite(reloadConfig("three", 3, []string{h1.addr}, "        max_queued_requests: 10\n"))
	status, res = postReload(t, c, p)
	if status != http.StatusConflict || len(res.Problems) != 1 ||
		!strings.Contains(res.Problems[0], "applications[0].deployments[0].max_queued_requests: changed from -1 to 10; that takes a restart") {
		t.Errorf("reload with a new max_queued_requests: %d %+v, want 409 naming the field", status, res)
	}
	if r := get(t, c, "http://"+p.HTTPAddr+"/hello"); r.body != "two" {
		t.Errorf("a refused reload changed /hello to %q", r.body)
	}
	if _, u := counts(); u != 2 {
		t.Errorf("a refused reload changed the upstreams: %d, want 2", u)
	}

	// An application added: refused, and the problem names it.
	rewrite(reloadConfig("three", 3, []string{h1.addr}, "") + `  - name: extra
    route_prefix: /extra
    deployments:
      - {name: e, handler: static}
`)
	status, res = postReload(t, c, p)
	if status != http.StatusConflict || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], `3 applications in the file, 2 running: adds "extra"`) {
		t.Errorf("reload adding an application: %d %+v, want 409 naming it", status, res)
	}

	// A file with a problem: refused, the problem named.
	rewrite(reloadConfig("three", 3, []string{h1.addr}, "        max_ongoing: 10\n"))
	status, res = postReload(t, c, p)
	if status != http.StatusBadRequest || len(res.Problems) == 0 || !strings.Contains(res.Problems[0], "max_ongoing: unknown field") {
		t.Errorf("reload of a bad file: %d %+v, want 400 naming the field", status, res)
	}
	if !p.logged("config reload refused: nothing changed") {
		t.Error("no log line says the reload was refused")
	}
}

// Replica hosts' deployments: a user_config given through the admin API
// (the file cannot hold one without host_handler) does not make every
// later reload a 409; and num_replicas and max_ongoing_requests, which
// the hosts read, are refused as taking a restart, not dropped in silence.
func TestReloadHostDeployments(t *testing.T) {
	host := startReplicaHost(t, "-handler", "static", "-replicas", "2", "-user-config", `{"body":"hi"}`)
	hosted := func(numReplicas int) string {
		return `applications:
  - name: hosts
    route_prefix: /
    deployments:
      - {name: h, handler: host, hosts: ["` + host.addr + `"]}
  - name: own
    route_prefix: /own
    deployments:
      - name: o
        handler: host
        hosts: ["` + host.addr + `"]
        host_handler: static
        num_replicas: ` + itoa(numReplicas) + `
`
	}
	path := writeConfig(t, hosted(2))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	req, _ := http.NewRequest(http.MethodPut, "http://"+p.AdminAddr+"/-/applications/hosts/deployments/h/user_config", strings.NewReader(`{"body":"changed"}`))
	if r := do(t, c, req); r.status != http.StatusOK {
		t.Fatalf("PUT user_config: %d %s", r.status, r.body)
	}
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 0 {
		t.Errorf("reload of the same file after an admin user_config: %d %+v, want 200 and nothing changed", status, res)
	}
	if err := os.WriteFile(path, []byte(hosted(3)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res := postReload(t, c, p)
	if status != http.StatusConflict || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "applications[1].deployments[0].num_replicas: changed from 2 to 3;") {
		t.Errorf("reload with the hosts' num_replicas changed: %d %+v, want 409 naming it with both values", status, res)
	}
	// So is max_ongoing_requests, which the hosts' actors enforce.
	if err := os.WriteFile(path, []byte(strings.Replace(hosted(2), "host_handler: static\n", "host_handler: static\n        max_ongoing_requests: 7\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res = postReload(t, c, p)
	if status != http.StatusConflict || len(res.Problems) != 1 ||
		!strings.Contains(res.Problems[0], "applications[1].deployments[0].max_ongoing_requests: 7, running 5; the replica hosts' actors enforce their own") {
		t.Errorf("reload with the hosts' max_ongoing_requests changed: %d %+v, want 409 naming it", status, res)
	}
}

// A user_config given through the admin API to a deployment whose file
// has none stays through reloads of that file; one the file gives is
// applied, and taking it out of the file again is refused.
func TestReloadKeepsAdminUserConfig(t *testing.T) {
	conf := func(extra string) string {
		return `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: static
` + extra
	}
	path := writeConfig(t, conf(""))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	if r := do(t, c, mustRequest(t, http.MethodPut, "http://"+p.AdminAddr+"/-/applications/hi/deployments/hi/user_config", `{"body":"admin"}`)); r.status != 200 {
		t.Fatalf("PUT user_config: %d %s", r.status, r.body)
	}
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 0 {
		t.Errorf("reload of the file without a user_config: %d %+v, want 200 and nothing changed", status, res)
	}
	if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.body != "admin" {
		t.Errorf("after the reload: %q, want the admin API's", r.body)
	}
	rewrite := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A file that gives the user_config running is no change, but gives it.
	rewrite(conf("        user_config: {body: admin}\n"))
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 0 {
		t.Errorf("reload giving the user_config that runs: %d %+v, want nothing changed", status, res)
	}
	rewrite(conf(""))
	if status, res := postReload(t, c, p); status != http.StatusConflict {
		t.Errorf("reload taking out the user_config the file gave: %d %+v, want 409", status, res)
	}
	rewrite(conf("        user_config: {body: file}\n"))
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 1 {
		t.Errorf("reload giving a user_config: %d %+v, want it applied", status, res)
	}
	if r := get(t, c, "http://"+p.HTTPAddr+"/"); r.body != "file" {
		t.Errorf("after the reload: %q, want the file's", r.body)
	}
	rewrite(conf(""))
	if status, res := postReload(t, c, p); status != http.StatusConflict || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "user_config: removed") {
		t.Errorf("reload taking the user_config out of the file: %d %+v, want 409", status, res)
	}
}

// Applications are known by name: a file that lists them in another
// order changes only what it changes in each, and a name no application
// has takes a restart.
func TestReloadAppsByName(t *testing.T) {
	app := func(name, body string) string {
		return `  - name: ` + name + `
    route_prefix: /` + name + `
    deployments:
      - {name: d, handler: static, user_config: {body: ` + body + `}}
`
	}
	path := writeConfig(t, "applications:\n"+app("a", "a1")+app("b", "b1"))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	rewrite := func(yaml string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rewrite("applications:\n" + app("b", "b2") + app("a", "a1"))
	status, res := postReload(t, c, p)
	if status != http.StatusOK || len(res.Applied) != 1 || !strings.Contains(res.Applied[0], `application "b"`) {
		t.Errorf("reload with the applications reordered and b changed: %d %+v, want b's user_config applied", status, res)
	}
	if ra, rb := get(t, c, "http://"+p.HTTPAddr+"/a"), get(t, c, "http://"+p.HTTPAddr+"/b"); ra.body != "a1" || rb.body != "b2" {
		t.Errorf("after the reload /a %q /b %q, want a1 b2", ra.body, rb.body)
	}
	rewrite("applications:\n" + app("b", "b2") + app("c", "a1"))
	status, res = postReload(t, c, p)
	if status != http.StatusConflict || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], `applications[1].name: "c" is no application that runs`) {
		t.Errorf("reload renaming an application: %d %+v, want 409 naming it", status, res)
	}
}

// A hosts list that is made but for a host that cannot be reached says
// both: what was made and what failed (it had said only the failure).
func TestReloadListMadeInPart(t *testing.T) {
	a, b := startReplicaHost(t, "-handler", "static", "-replicas", "1"), startReplicaHost(t, "-handler", "static", "-replicas", "1")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	conf := func(hosts string) string {
		return "applications:\n  - name: h\n    route_prefix: /\n    deployments:\n      - {name: h, handler: host, hosts: [" + hosts + "]}\n"
	}
	path := writeConfig(t, conf(`"`+a.addr+`", "`+b.addr+`"`))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	if err := os.WriteFile(path, []byte(conf(`"`+a.addr+`", "`+dead+`"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res := postReload(t, c, p)
	if status != http.StatusInternalServerError || len(res.Applied) != 1 || !strings.Contains(res.Applied[0], "all but the targets that failed") ||
		len(res.Failed) != 1 || !strings.Contains(res.Failed[0], dead) {
		t.Errorf("reload dropping one host and adding one that is down: %d %+v", status, res)
	}
	waitUntil(t, "the one replica of the host kept (the other drained)", func() bool {
		return len(getApplications(t, c, p).Applications[0].Deployments[0].Replicas) == 1
	})

	// The list made in part is the deployment's: the file of the start,
	// given again, is a change back to it. (Only the last list made whole
	// was recorded: the file matched it, and the drained host stayed out,
	// as a host that connected later stayed in; a tester.)
	if err := os.WriteFile(path, []byte(conf(`"`+a.addr+`", "`+b.addr+`"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res = postReload(t, c, p)
	if status != http.StatusOK || len(res.Applied) != 1 || !strings.Contains(res.Applied[0], b.addr) {
		t.Errorf("reload back to the first hosts: %d %+v, want the hosts changed", status, res)
	}
	waitUntil(t, "both hosts' replicas in again", func() bool {
		return len(getApplications(t, c, p).Applications[0].Deployments[0].Replicas) == 2
	})
}

// userConfigChangedWithHostsDown starts a proxy in front of hosts (a host
// deployment of static actors, its file's user_config body "old"), kills
// the hosts in down and waits until the proxy has seen them go, then
// changes the file's body to "new" for the test to reload.
func userConfigChangedWithHostsDown(t *testing.T, hosts []*hiProcess, down ...*hiProcess) (*proc, *http.Client) {
	t.Helper()
	addrs := make([]string, len(hosts))
	for i, h := range hosts {
		addrs[i] = h.addr
	}
	conf := func(body string) string {
		return `applications:
  - name: hi
    route_prefix: /
    deployments:
      - name: hi
        handler: host
        hosts: ["` + strings.Join(addrs, `", "`) + `"]
        host_handler: static
        num_replicas: 2
        health_check_period_s: 60
        user_config: {body: ` + body + `}
`
	}
	path := writeConfig(t, conf("old"))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	c.Timeout = 40 * time.Second
	for _, h := range down {
		_ = h.cmd.Process.Signal(syscall.SIGKILL)
	}
	if !p.waitLogged("replica host connection lost", startTimeout) {
		t.Fatal("the proxy did not see the killed host go")
	}
	if err := os.WriteFile(path, []byte(conf("new")), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, c
}

// A reload whose user_config reaches one host's actors and not another's
// (down) answers 207, listing the change in partial with how many missed
// it, as PUT .../user_config does: it answered 200 (found by a tester).
// The host, back, is given it.
func TestReloadUserConfigWithAHostDown(t *testing.T) {
	args := []string{"-handler", "static", "-replicas", "2", "-user-config", `{"body":"old"}`}
	up, down := startReplicaHost(t, args...), startReplicaHost(t, args...)
	p, c := userConfigChangedWithHostsDown(t, []*hiProcess{up, down}, down)
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.AdminAddr+"/-/reload", nil)
	r := do(t, c, req)
	var res struct {
		Applied, Partial, Failed []string
	}
	if err := json.Unmarshal([]byte(r.body), &res); err != nil {
		t.Fatalf("POST /-/reload: %d %q: %v", r.status, r.body, err)
	}
	if r.status != http.StatusMultiStatus || len(res.Applied) != 1 || len(res.Partial) != 1 || len(res.Failed) != 0 ||
		!strings.Contains(res.Partial[0], "2 of 4 replicas have not taken it") {
		t.Fatalf("reload with a host down = %d %s, want 207 with the user_config change partial, 2 of 4", r.status, r.body)
	}
	if !p.waitLogged("config reloaded, but not every replica took every change", 10*time.Second) {
		t.Error("no log line says the reload did not reach every replica")
	}
	if got := get(t, c, "http://"+p.HTTPAddr+"/"); got.status != http.StatusOK || got.body != "new" {
		t.Errorf("GET / after the reload = %d %q, want the new body from the host up", got.status, got.body)
	}
	// Reloading the same file again changes nothing: the change was
	// recorded, and the host down gets it when it is back.
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 0 {
		t.Errorf("the same file again: %d %+v, want 200 and nothing changed", status, res)
	}
	startListening(t, replicaBin, append([]string{"-listen", down.addr}, args...)...)
	waitUntil(t, "the host back in routing", func() bool {
		n := 0
		for _, rep := range getApplications(t, c, p).Applications[0].Deployments[0].Replicas {
			if rep.State == "RUNNING" && rep.Healthy {
				n++
			}
		}
		return n == 4
	})
	for i := range 40 { // the actors back are given it before they serve
		if got := get(t, c, "http://"+p.HTTPAddr+"/"); got.body != "new" {
			t.Fatalf("GET %d with the host back = %d %q, want the new body", i, got.status, got.body)
		}
	}
}

// With every host down, a user_config change reaches no replica: nothing
// changes, the answer says so (it said "every replica rejected the
// user_config: ... connection refused", found by a tester), and the same
// reload once the host is back applies it. (Adopting it instead would
// hand the hosts, once back, a config no factory of the proxy's checked
// and none of them took: a review found it could leave none in routing.)
func TestReloadUserConfigWithEveryHostDown(t *testing.T) {
	args := []string{"-handler", "static", "-replicas", "2", "-user-config", `{"body":"old"}`}
	host := startReplicaHost(t, args...)
	p, c := userConfigChangedWithHostsDown(t, []*hiProcess{host}, host)
	r := do(t, c, mustRequest(t, http.MethodPost, "http://"+p.AdminAddr+"/-/reload", ""))
	if r.status != http.StatusInternalServerError || !strings.Contains(r.body, "no replica could be reached to take the user_config") {
		t.Fatalf("reload with every host down = %d %s, want 500, no replica reached", r.status, r.body)
	}
	put := do(t, c, mustRequest(t, http.MethodPut, "http://"+p.AdminAddr+"/-/applications/hi/deployments/hi/user_config", `{"body":"put"}`))
	if put.status != http.StatusServiceUnavailable || !strings.Contains(put.body, "no replica could be reached") {
		t.Fatalf("PUT user_config with every host down = %d %s, want 503, no replica reached", put.status, put.body)
	}
	startListening(t, replicaBin, append([]string{"-listen", host.addr}, args...)...)
	waitUntil(t, "the host back serving", func() bool {
		return get(t, c, "http://"+p.HTTPAddr+"/").status == http.StatusOK
	})
	if got := get(t, c, "http://"+p.HTTPAddr+"/"); got.body != "old" {
		t.Fatalf("GET with the host back = %d %q, want the old body: nothing changed", got.status, got.body)
	}
	if status, res := postReload(t, c, p); status != http.StatusOK || len(res.Applied) != 1 {
		t.Fatalf("the same reload with the host back: %d %+v, want 200, the user_config applied", status, res)
	}
	for i := range 20 {
		if got := get(t, c, "http://"+p.HTTPAddr+"/"); got.body != "new" {
			t.Fatalf("GET %d with the host back = %d %q, want the new body", i, got.status, got.body)
		}
	}
}

// A file's user_config for a host deployment is checked with host_handler
// unless that very one was checked before: one the admin API gave the
// hosts (which run another handler here) and the file then copies is no
// exception. A reload answered 200 for a file -check refuses (found by a
// tester).
func TestReloadChecksWhatTheAdminAPIGave(t *testing.T) {
	args := []string{"-handler", "sleep", "-replicas", "2", "-user-config", `{"ms":1,"body":"v7"}`}
	host := startReplicaHost(t, args...)
	conf := func(uc string) string {
		return `applications:
  - name: h
    route_prefix: /
    deployments:
      - name: h
        handler: host
        hosts: ["` + host.addr + `"]
        host_handler: static
        num_replicas: 2
        user_config: ` + uc + `
`
	}
	path := writeConfig(t, conf("{body: v7}"))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	put := do(t, c, mustRequest(t, http.MethodPut, "http://"+p.AdminAddr+"/-/applications/h/deployments/h/user_config", `{"ms":5,"body":"slept"}`))
	if put.status != http.StatusOK {
		t.Fatalf("PUT user_config: %d %s", put.status, put.body)
	}
	if err := os.WriteFile(path, []byte(conf("{ms: 5, body: slept}")), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res := postReload(t, c, p)
	if status != http.StatusBadRequest || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], ":10: applications[0].deployments[0].user_config") ||
		!strings.Contains(res.Problems[0], `unknown field "ms"`) {
		t.Fatalf("reload of a user_config static refuses: %d %+v, want 400 naming line 10's user_config", status, res)
	}
}

// A reload that lowers max_ongoing_requests and adds an upstream lowers
// the limit first: the new upstream's replica joins with the new one, and
// takes no queued request under the old (found by a tester, who saw five
// requests given at once to a replica whose limit was 1).
func TestReloadLimitBeforeTargets(t *testing.T) {
	h1, h2 := startHi(t), startHi(t)
	conf := func(limit int, ups ...string) string {
		return `applications:
  - name: up
    route_prefix: /
    deployments:
      - name: up
        handler: upstream
        upstreams: ["http://` + strings.Join(ups, `", "http://`) + `"]
        health_check_path: /
        max_ongoing_requests: ` + itoa(limit) + "\n"
	}
	path := writeConfig(t, conf(5, h1.addr))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	if err := os.WriteFile(path, []byte(conf(1, h1.addr, h2.addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res := postReload(t, c, p)
	if status != http.StatusOK || len(res.Applied) != 2 ||
		!strings.Contains(res.Applied[0], "max_ongoing_requests from 5 to 1") || !strings.Contains(res.Applied[1], "upstreams") {
		t.Fatalf("reload: %d %+v, want max_ongoing_requests applied, then the upstreams", status, res)
	}
	d := getApplications(t, c, p).Applications[0].Deployments[0]
	if len(d.Replicas) != 2 || d.MaxOngoing != 1 {
		t.Errorf("after the reload: %d replicas, max_ongoing_requests %d (absent when they differ); want 2 replicas, all at 1", len(d.Replicas), d.MaxOngoing)
	}
}

// A SIGHUP after a SIGTERM changes nothing: the reload it asks for is
// refused, not made while the deployments stop (found by a tester: one
// that waited for a POST /-/reload was made after the drain began, and
// failed). (Sent together, the kernel delivers SIGHUP first: that one is
// a reload begun before the shutdown.)
func TestReloadRefusedOnceShuttingDown(t *testing.T) {
	path := writeConfig(t, reloadConfig("one", 1, []string{startHi(t).addr}, ""))
	p := startProxy(t, map[string]string{"PROXY_DRAIN_DELAY": "2s"}, "-config", path)
	if err := os.WriteFile(path, []byte(reloadConfig("two", 1, []string{startHi(t).addr}, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	p.signal(syscall.SIGTERM)
	if !p.waitLogged("draining", 10*time.Second) {
		t.Fatalf("no drain logged:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
	p.signal(syscall.SIGHUP)
	if code, ok := p.wait(30 * time.Second); !ok || code != 0 {
		t.Fatalf("exit %d (exited: %v), want 0", code, ok)
	}
	if p.logged("config reloaded") || p.logged("config reload:") || !p.logged("nothing is reloaded") {
		t.Fatalf("a reload was made during the shutdown, or its refusal not logged:\n%s", strings.Join(p.stderrLines(), "\n"))
	}
}

// A reload that adds a replica host whose actors refuse the deployment's
// user_config says so (207, partial), where it answered 200 and only the
// log told that the new host's actors never served (a tester).
func TestReloadHostRefusingTheUserConfig(t *testing.T) {
	good := startReplicaHost(t, "-handler", "static", "-replicas", "1")
	bad := startReplicaHost(t, "-handler", "echo", "-replicas", "2")
	file := func(hosts string) string {
		return `applications:
  - name: a
    route_prefix: /
    deployments:
      - name: h
        handler: host
        hosts: [` + hosts + `]
        host_handler: static
        num_replicas: 1
        user_config: {body: hi}
`
	}
	path := writeConfig(t, file(`"`+good.addr+`"`))
	p := startProxy(t, nil, "-config", path)
	c := newClient(t, 4)
	if err := os.WriteFile(path, []byte(file(`"`+good.addr+`", "`+bad.addr+`"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res := postReload(t, c, p)
	if status != http.StatusMultiStatus || len(res.Partial) != 1 || !strings.Contains(res.Partial[0], "target "+bad.addr+": 2 of its 2 replicas did not take the deployment's user_config") {
		t.Errorf("reload adding a host whose actors refuse the user_config: %d %+v, want 207 naming it", status, res)
	}

	// With a host that cannot be reached beside another that refuses:
	// each said where it belongs (found by review: both were failed).
	bad2 := startReplicaHost(t, "-handler", "echo", "-replicas", "1")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String() // nothing listens there once closed
	l.Close()
	if err := os.WriteFile(path, []byte(file(`"`+good.addr+`", "`+bad.addr+`", "`+bad2.addr+`", "`+dead+`"`)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res = postReload(t, c, p)
	if len(res.Partial) != 1 || !strings.Contains(res.Partial[0], "target "+bad2.addr+": 1 of its 1 replicas") || strings.Contains(res.Partial[0], "replica host "+dead) ||
		len(res.Failed) != 1 || !strings.Contains(res.Failed[0], "replica host "+dead) || strings.Contains(res.Failed[0], "target "+bad2.addr) {
		t.Errorf("reload adding a host that refuses and one that cannot be reached: %d %+v, want the first in partial, the second in failed", status, res)
	}
}

// A file's http_options the environment overrides, edited, is no change,
// and the answer says why, as -check does: it had answered "nothing
// changed" with no word of the edit (a tester).
func TestReloadWarnsOfOverriddenOptions(t *testing.T) {
	file := func(timeout int) string {
		return "http_options: {request_timeout_s: " + itoa(timeout) + "}\napplications:\n" +
			"  - {name: a, route_prefix: /, deployments: [{name: d, handler: static}]}\n"
	}
	path := writeConfig(t, file(3))
	p := startProxy(t, map[string]string{"PROXY_REQUEST_TIMEOUT": "5s"}, "-config", path)
	if err := os.WriteFile(path, []byte(file(7)), 0o600); err != nil {
		t.Fatal(err)
	}
	status, res := postReload(t, newClient(t, 1), p)
	if status != http.StatusOK || len(res.Applied) != 0 || len(res.Warnings) != 1 ||
		!strings.Contains(res.Warnings[0], "http_options.request_timeout_s: 7 is overridden by PROXY_REQUEST_TIMEOUT=5s") {
		t.Fatalf("reload of an overridden request_timeout_s: %d %+v, want 200, nothing applied, a warning naming it", status, res)
	}
}
