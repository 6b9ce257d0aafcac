package gctune

import "github.com/prometheus/client_golang/prometheus"

var (
	tuningDesc = prometheus.NewDesc("serve_proxy_gc_tuning_enabled",
		"Whether the proxy's GC tuning is on (1) or Go's defaults are in force (0).", nil, nil)
	percentDesc = prometheus.NewDesc("serve_proxy_gc_percent",
		"The GOGC in force; -1 when proportional collection is off.", nil, nil)
	limitDesc = prometheus.NewDesc("serve_proxy_gc_memory_limit_bytes",
		"The soft memory limit in force, in bytes; 0 when there is none.", nil, nil)
)

// Collector returns a Prometheus collector of the settings in force, read
// at scrape time.
func (t *Tuner) Collector() prometheus.Collector { return collector{t} }

type collector struct{ t *Tuner }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- tuningDesc
	ch <- percentDesc
	ch <- limitDesc
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.t.State()
	tuning := 0.0
	if s.Tuning {
		tuning = 1
	}
	ch <- prometheus.MustNewConstMetric(tuningDesc, prometheus.GaugeValue, tuning)
	ch <- prometheus.MustNewConstMetric(percentDesc, prometheus.GaugeValue, float64(s.Percent))
	ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(s.MemoryLimitBytes))
}
