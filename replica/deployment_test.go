package replica

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A spec no deployment can run with is refused by name, not run: a zero
// MaxOngoingRequests had every request wait forever in silence, a zero
// HealthCheckTimeout replaced healthy replicas every few checks, a nil
// Factory panicked at the first start (found by a tester using the Go
// API).
func TestDeploymentSpecValidate(t *testing.T) {
	factory := Factory(func(json.RawMessage) (Handler, error) {
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), nil
	})
	good := func() DeploymentSpec {
		return DeploymentSpec{App: "a", Name: "d", Factory: factory, NumReplicas: 1, MaxOngoingRequests: 5,
			HealthCheckPeriod: 10 * time.Second, HealthCheckTimeout: 30 * time.Second, GracefulShutdownTimeout: 20 * time.Second}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("Serve's defaults: %v", err)
	}
	for _, c := range []struct {
		change func(*DeploymentSpec)
		want   string
	}{
		{func(s *DeploymentSpec) { s.App = "" }, "App is empty"},
		{func(s *DeploymentSpec) { s.Name = "" }, "Name is empty"},
		{func(s *DeploymentSpec) { s.Factory = nil }, "none of Factory, Start or Connect is set"},
		{func(s *DeploymentSpec) { s.NumReplicas = -1 }, "NumReplicas is -1"},
		{func(s *DeploymentSpec) { s.MaxOngoingRequests = 0 }, "MaxOngoingRequests is 0, must be 1 or more"},
		{func(s *DeploymentSpec) { s.HealthCheckPeriod = -time.Second }, "HealthCheckPeriod is -1s"},
		{func(s *DeploymentSpec) { s.HealthCheckTimeout = 0 }, "HealthCheckTimeout is 0s, must be above 0"},
		{func(s *DeploymentSpec) { s.GracefulShutdownTimeout = -time.Second }, "GracefulShutdownTimeout is -1s"},
		{func(s *DeploymentSpec) { s.MaxConstructorRetryCount = -1 }, "MaxConstructorRetryCount is -1"},
	} {
		s := good()
		c.change(&s)
		d, err := NewDeployment(context.Background(), s, Hooks{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			if d != nil {
				_ = d.Stop(context.Background())
			}
			t.Errorf("NewDeployment: %v, want an error saying %q", err, c.want)
		}
	}
}
