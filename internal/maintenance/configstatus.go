package maintenance

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// Condition reasons of a MaintenanceOperatorConfig.
const (
	configReasonValid     = "Valid"
	configReasonOpen      = "Open"
	configReasonClosed    = "Closed"
	configReasonAlways    = "NoWindows"
	configReasonUnknown   = "InvalidConfig"
	configReasonLeaseHeld = "LeaseHeld"
	configReasonLeaseFree = "NoLiveLease"
	// configReasonRunsUnfenced: an operator runs that no lease shows
	// (NVIDIA's without leader election, a second gpufleet).
	configReasonRunsUnfenced = "OperatorRunsWithoutLease"
)

// writeConfigStatus records on the config whether it could be read and
// whether the maintenance calendar is open. It writes only when a condition
// changed, and emits an event only after the write succeeded.
func (s *Scheduler) writeConfigStatus(ctx context.Context, cfg *maintenancev1.MaintenanceOperatorConfig, cfgErr error, window CalendarState, holding *liveowner.Holding, now time.Time) error {
	after := cfg.DeepCopy()
	wasHeld := meta.IsStatusConditionTrue(cfg.Status.Conditions, maintenancev1.ConfigConditionOtherOperatorActive)
	if holding != nil {
		if c := meta.FindStatusCondition(cfg.Status.Conditions, maintenancev1.ConfigConditionOtherOperatorActive); c != nil &&
			c.Status == metav1.ConditionTrue && holding.Names(c.Message) {
			return nil // the same holder, renewed: nothing new to say
		}
		reason := configReasonLeaseHeld
		if holding.Reason != "" {
			reason = configReasonRunsUnfenced
		}
		// Only this condition: the others describe the last pass, which
		// still holds for when gpufleet may act.
		meta.SetStatusCondition(&after.Status.Conditions, metav1.Condition{Type: maintenancev1.ConfigConditionOtherOperatorActive,
			Status: metav1.ConditionTrue, Reason: reason, Message: holding.Message(),
			ObservedGeneration: cfg.Generation, LastTransitionTime: metav1.NewTime(now)})
		if conditionsEqual(cfg.Status.Conditions, after.Status.Conditions) {
			return nil
		}
		if err := s.Client.Status().Patch(ctx, after, client.MergeFromWithOptions(cfg, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("writing the status of MaintenanceOperatorConfig %s: %w", client.ObjectKeyFromObject(cfg), err)
		}
		if !wasHeld {
			s.Recorder.Eventf(cfg, nil, corev1.EventTypeWarning, ReasonOtherOperatorActive, actionSchedule, "%s", holding.Message())
		}
		return nil
	}
	if c := meta.FindStatusCondition(cfg.Status.Conditions, maintenancev1.ConfigConditionOtherOperatorActive); c != nil {
		meta.SetStatusCondition(&after.Status.Conditions, metav1.Condition{Type: maintenancev1.ConfigConditionOtherOperatorActive,
			Status: metav1.ConditionFalse, Reason: configReasonLeaseFree,
			Message:            "no live leader lease of " + liveowner.MaintenanceOperator.Name + ": gpufleet acts on NodeMaintenance objects",
			ObservedGeneration: cfg.Generation, LastTransitionTime: metav1.NewTime(now)})
	}
	wasInvalid := meta.IsStatusConditionTrue(cfg.Status.Conditions, maintenancev1.ConfigConditionInvalid)
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&after.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason,
			Message: msg, ObservedGeneration: cfg.Generation, LastTransitionTime: metav1.NewTime(now)})
	}
	if cfgErr != nil {
		set(maintenancev1.ConfigConditionInvalid, metav1.ConditionTrue, configReasonUnknown, invalidConfigMessage(cfgErr, s.lastValid))
	} else {
		set(maintenancev1.ConfigConditionInvalid, metav1.ConditionFalse, configReasonValid, "the configuration applies")
	}
	switch {
	case cfgErr != nil && s.lastValid == nil:
		set(maintenancev1.ConfigConditionWindowOpen, metav1.ConditionFalse, configReasonUnknown, "no valid configuration: nothing is scheduled")
	case !window.Open:
		set(maintenancev1.ConfigConditionWindowOpen, metav1.ConditionFalse, configReasonClosed, window.Reason)
	case window.NextChange.IsZero():
		set(maintenancev1.ConfigConditionWindowOpen, metav1.ConditionTrue, configReasonAlways, "no maintenance windows or exclusions: maintenance may start at any time")
	default:
		set(maintenancev1.ConfigConditionWindowOpen, metav1.ConditionTrue, configReasonOpen,
			"new maintenance may start; the window may close at "+window.NextChange.Format(time.RFC3339))
	}
	after.Status.ObservedGeneration = cfg.Generation
	if conditionsEqual(cfg.Status.Conditions, after.Status.Conditions) && cfg.Status.ObservedGeneration == after.Status.ObservedGeneration {
		return nil
	}
	if err := s.Client.Status().Patch(ctx, after, client.MergeFromWithOptions(cfg, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("writing the status of MaintenanceOperatorConfig %s: %w", client.ObjectKeyFromObject(cfg), err)
	}
	s.configEvent(cfg, cfgErr, wasInvalid)
	return nil
}

// writeLiveOwnerStatus records on the default config, if there is one,
// that NVIDIA's Maintenance Operator holds the NodeMaintenance objects
// (with one Warning event when that starts).
func (s *Scheduler) writeLiveOwnerStatus(ctx context.Context, holding *liveowner.Holding) error {
	cfg, err := s.config(ctx)
	if err != nil || cfg == nil {
		return err
	}
	return s.writeConfigStatus(ctx, cfg, nil, CalendarState{}, holding, s.Clock.Now())
}

// configEvent reports a change of the config's validity (after its status
// write succeeded).
func (s *Scheduler) configEvent(cfg *maintenancev1.MaintenanceOperatorConfig, cfgErr error, wasInvalid bool) {
	switch {
	case cfgErr != nil && !wasInvalid:
		s.Recorder.Eventf(cfg, nil, corev1.EventTypeWarning, ReasonInvalidConfig, actionValidate, "%s", invalidConfigMessage(cfgErr, s.lastValid))
	case cfgErr == nil && wasInvalid:
		s.Recorder.Eventf(cfg, nil, corev1.EventTypeNormal, ReasonConfigValid, actionValidate, "The configuration (generation %d) applies", cfg.Generation)
	}
}

func invalidConfigMessage(err error, lastValid *Config) string {
	keeps := "nothing is scheduled until it is fixed"
	if lastValid != nil {
		keeps = fmt.Sprintf("the previous valid configuration (generation %d) keeps applying", lastValid.Generation)
	}
	return fmt.Sprintf("%v; %s", err, keeps)
}

// conditionsEqual compares conditions ignoring order and transition times
// (SetStatusCondition keeps the time of an unchanged status).
func conditionsEqual(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		d := meta.FindStatusCondition(b, c.Type)
		if d == nil || d.Status != c.Status || d.Reason != c.Reason || d.Message != c.Message || d.ObservedGeneration != c.ObservedGeneration {
			return false
		}
	}
	return true
}
