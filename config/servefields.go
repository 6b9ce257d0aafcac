package config

// serveFields are the fields of Ray Serve's config file (ServeDeploySchema
// and the schemas under it) that this proxy does not take, keyed by the
// section they are in, with what to do instead. A Ray Serve user's file
// names them; "unknown field" alone would read as a typo.
var serveFields = map[string]map[string]string{
	"Config": {
		"proxy_location":  "where Ray runs its proxies; this proxy serves where it is started: remove it",
		"grpc_options":    "gRPC is not served, HTTP only: remove it",
		"logging_config":  "logs are set by the environment: PROXY_LOG_LEVEL, PROXY_LOG_FORMAT, PROXY_ACCESS_LOG",
		"target_capacity": "not supported: set each deployment's num_replicas",
	},
	"HTTPOptions": {
		"root_path":    "not supported: put the path in each application's route_prefix",
		"ssl_keyfile":  "the proxy serves plain HTTP: terminate TLS in front of it (a load balancer, an ingress)",
		"ssl_certfile": "the proxy serves plain HTTP: terminate TLS in front of it (a load balancer, an ingress)",
		"location":     "where Ray runs its proxies (an older name of proxy_location); this proxy serves where it is started: remove it",
		"middlewares":  "no ASGI middlewares: put the behaviour in the replicas, or in front of the proxy",
	},
	"Application": {
		"import_path":             "Python code is not imported: run the app as a process of its own (a deployment with handler: command, serving HTTP on $PORT) or point handler: upstream at it",
		"runtime_env":             "no Ray runtime environments: a handler: command deployment takes env and working_dir",
		"args":                    "no application builder arguments: a handler: command deployment takes its arguments in command, a built-in handler its user_config",
		"logging_config":          "logs are set by the environment: PROXY_LOG_LEVEL, PROXY_LOG_FORMAT, PROXY_ACCESS_LOG",
		"external_scaler_enabled": "not supported: change num_replicas with PUT /-/applications/{app}/deployments/{deployment}/num_replicas on the admin listener",
		"host":                    "the proxy listens on http_options.host (or PROXY_HTTP_ADDR) for every application",
		"port":                    "the proxy listens on http_options.port (or PROXY_HTTP_ADDR) for every application",
	},
	"Deployment": {
		"autoscaling_config":                      "autoscaling is not supported: set num_replicas, or change it live with PUT /-/applications/{app}/deployments/{deployment}/num_replicas on the admin listener",
		"ray_actor_options":                       "Ray's resources (num_cpus, num_gpus, memory) mean nothing here, where a replica is an actor in the proxy or a process of its own: remove it",
		"placement_group_bundles":                 "the proxy does not place replicas on machines (a scheduler such as Kubernetes does; see deploy/): remove it",
		"placement_group_strategy":                "the proxy does not place replicas on machines (a scheduler such as Kubernetes does; see deploy/): remove it",
		"max_replicas_per_node":                   "the proxy does not place replicas on machines (a scheduler such as Kubernetes does; see deploy/): remove it",
		"graceful_shutdown_wait_loop_s":           "not needed: a stopping replica is watched until its last request ends, for at most graceful_shutdown_timeout_s",
		"logging_config":                          "logs are set by the environment: PROXY_LOG_LEVEL, PROXY_LOG_FORMAT, PROXY_ACCESS_LOG",
		"request_router_config":                   "the router is power of two choices, not configurable: remove it",
		"route_prefix":                            "route prefixes are the applications' (as in Ray Serve's config file): set the application's route_prefix",
		"max_concurrent_queries":                  "Ray Serve's older name of max_ongoing_requests: use max_ongoing_requests",
		"version":                                 "replicas are not versioned: a changed user_config is given to the running replicas (reload, or PUT .../user_config)",
		"target_num_ongoing_requests_per_replica": "autoscaling is not supported: set num_replicas, or change it live with PUT /-/applications/{app}/deployments/{deployment}/num_replicas on the admin listener",
	},
}

// serveFieldHint is what to do instead of the Ray Serve field key of
// section, or "" if key is not one.
func serveFieldHint(section, key string) string {
	return serveFields[section][key]
}
