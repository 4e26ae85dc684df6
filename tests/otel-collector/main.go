// An OpenTelemetry Collector with only what the tests need: the OTLP receiver and the file
// exporter, which writes every span it receives as OTLP JSON, one request per line. The tests
// read that file (tests/src/otel_collector.rs) to see what the relay exported.
//
// Written by hand in the shape the collector builder (ocb) generates, so that no builder has to
// be fetched: scripts/services.sh otel-collector builds this module, cached by its inputs.
package main

import (
	"context"
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The version of the collector modules go.mod names (one release for all of them).
const version = "0.161.0"

func components() (otelcol.Factories, error) {
	receivers, err := otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	exporters, err := otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	return otelcol.Factories{Receivers: receivers, Exporters: exporters, Telemetry: telemetryFactory()}, nil
}

// The collector's own telemetry, as the tests need it: its log on stderr (the test's log file),
// and no metrics or traces of its own. The collector's standard telemetry factory
// (otelconftelemetry) serves its metrics on port 8888 by default, where two tests' collectors
// would collide, and brings in the cloud and Kubernetes resource detectors (client-go among
// them), which would double the build. With this one the configuration has no
// service::telemetry section (its config type has no fields).
func telemetryFactory() telemetry.Factory {
	return telemetry.NewFactory(
		func() component.Config { return &struct{}{} },
		telemetry.WithCreateLogger(func(_ context.Context, set telemetry.LoggerSettings, _ component.Config) (*zap.Logger, component.ShutdownFunc, error) {
			config := zap.NewProductionConfig()
			config.Encoding = "console"
			config.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
			config.Sampling = nil // every line, however many: they explain a failing test
			build := set.BuildZapLogger
			if build == nil {
				build = zap.Config.Build
			}
			logger, err := build(config)
			return logger, nil, err
		}),
	)
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "outbox-otelcol",
			Description: "OpenTelemetry Collector (OTLP receiver, file exporter) for Outbox Relay's tests",
			Version:     version,
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
				DefaultScheme:     "file",
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
