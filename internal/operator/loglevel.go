package operator

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// +kubebuilder:rbac:groups=maintenance.nvidia.com,resources=maintenanceoperatorconfigs,verbs=get;list;watch

// ParseLogLevel maps a log level name (spec.logLevel of
// MaintenanceOperatorConfig, the --log-level flag) to a zap level: debug
// is zap's DebugLevel, which also enables logr's V(1) lines; info is
// InfoLevel; error is ErrorLevel (only errors).
func ParseLogLevel(name string) (zapcore.Level, error) {
	switch maintenancev1.LogLevel(name) {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	default:
		return 0, fmt.Errorf("unknown log level %q (want debug, info or error)", name)
	}
}

// LogLevelReconciler makes Level follow spec.logLevel of the default
// MaintenanceOperatorConfig in Namespace. Without that config, or with an
// empty logLevel, Level is Default (the command line's); an unknown value
// keeps the current level.
type LogLevelReconciler struct {
	Client    client.Reader
	Namespace string
	Level     *zap.AtomicLevel
	Default   zapcore.Level
}

// Reconcile reads the config and sets the level.
func (r *LogLevelReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	want := r.Default
	var cfg maintenancev1.MaintenanceOperatorConfig
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: maintenancev1.DefaultConfigName}, &cfg)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("reading MaintenanceOperatorConfig: %w", err)
	case cfg.Spec.LogLevel != "":
		if want, err = ParseLogLevel(string(cfg.Spec.LogLevel)); err != nil {
			log.Error(err, "keeping the current log level", "level", r.Level.Level().String())
			return reconcile.Result{}, nil
		}
	}
	r.set(log, want)
	return reconcile.Result{}, nil
}

// set changes the level and says so, logging while the more verbose of the
// two levels is active so that the line shows.
func (r *LogLevelReconciler) set(log logr.Logger, to zapcore.Level) {
	from := r.Level.Level()
	if from == to {
		return
	}
	if to < from { // more verbose: set, then log
		r.Level.SetLevel(to)
		log.Info("log level changed", "from", from.String(), "to", to.String())
		return
	}
	log.Info("log level changed", "from", from.String(), "to", to.String())
	r.Level.SetLevel(to)
}

// setupLogLevel registers the LogLevelReconciler; the level's current value
// is the default. It runs on every replica, leader or not.
func setupLogLevel(mgr manager.Manager, namespace string, level *zap.AtomicLevel) error {
	r := &LogLevelReconciler{Client: mgr.GetClient(), Namespace: namespace, Level: level, Default: level.Level()}
	isDefault := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == namespace && o.GetName() == maintenancev1.DefaultConfigName
	})
	err := builder.ControllerManagedBy(mgr).Named("loglevel").
		For(&maintenancev1.MaintenanceOperatorConfig{}, builder.WithPredicates(isDefault, predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, NeedLeaderElection: ptr.To(false)}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the log level controller: %w", err)
	}
	return nil
}
