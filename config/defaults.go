package config

import "encoding/json"

// The defaults of fields absent from a file; the deployment ones are Ray
// Serve's.
const (
	defaultHost              = "127.0.0.1"
	defaultPort              = 8000
	defaultRequestTimeoutS   = 0 // no timeout
	defaultKeepAliveTimeoutS = 90

	defaultRoutePrefix = "/"

	defaultNumReplicas              = 1
	defaultMaxOngoingRequests       = 5
	defaultMaxQueuedRequests        = -1 // no limit
	defaultHealthCheckPeriodS       = 10
	defaultHealthCheckTimeoutS      = 30
	defaultGracefulShutdownTimeoutS = 20
	defaultMaxConstructorRetryCount = 20
	defaultDiscoveryIntervalS       = 10
	defaultHealthCheckPath          = "/-/healthz"
)

// defaulter is a config struct that can fill itself with the values its
// fields take when the file leaves them out. Parse fills each struct before
// decoding onto it, so only the keys present in the file replace defaults,
// and an explicit zero stays a zero for validation to reject.
type defaulter interface{ setDefaults() }

var (
	_ defaulter = (*Config)(nil)
	_ defaulter = (*HTTPOptions)(nil)
	_ defaulter = (*Application)(nil)
	_ defaulter = (*Deployment)(nil)
)

func (c *Config) setDefaults() {
	c.HTTPOptions.setDefaults()
	c.Applications = nil
}

func (o *HTTPOptions) setDefaults() {
	*o = HTTPOptions{
		Host:              defaultHost,
		Port:              defaultPort,
		RequestTimeoutS:   defaultRequestTimeoutS,
		KeepAliveTimeoutS: defaultKeepAliveTimeoutS,
	}
}

func (a *Application) setDefaults() {
	*a = Application{RoutePrefix: defaultRoutePrefix}
}

func (d *Deployment) setDefaults() {
	*d = Deployment{
		NumReplicas:              defaultNumReplicas,
		MaxOngoingRequests:       defaultMaxOngoingRequests,
		MaxQueuedRequests:        defaultMaxQueuedRequests,
		HealthCheckPeriodS:       defaultHealthCheckPeriodS,
		HealthCheckTimeoutS:      defaultHealthCheckTimeoutS,
		GracefulShutdownTimeoutS: defaultGracefulShutdownTimeoutS,
		MaxConstructorRetryCount: defaultMaxConstructorRetryCount,
		DiscoveryIntervalS:       defaultDiscoveryIntervalS,
		HealthCheckPath:          defaultHealthCheckPath,
	}
}

// Default returns the config used when no file is given: the seed's
// benchmark application, a static "hi" at "/" on 16 replicas of 100
// concurrent requests each, with every other field at its default. Each call
// returns a new value that the caller may change.
func Default() *Config {
	c := new(Config)
	c.setDefaults()

	var d Deployment
	d.setDefaults()
	d.Name = "hello"
	d.Handler = "static"
	d.NumReplicas = 16
	d.MaxOngoingRequests = 100
	d.UserConfig = json.RawMessage(`{"body":"hi"}`)

	var a Application
	a.setDefaults()
	a.Name = "default"
	a.Deployments = []Deployment{d}

	c.Applications = []Application{a}
	return c
}
