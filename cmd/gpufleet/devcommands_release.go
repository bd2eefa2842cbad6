//go:build release

package main

import "github.com/spf13/cobra"

// devCommands: the released binary has no development commands.
func devCommands() []*cobra.Command { return nil }
