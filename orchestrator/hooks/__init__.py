"""Hooks: the user's own programs at fixed points of the loop (docs/hooks.md), as Gemini CLI has them.

policy/hook_spec.py: the `[[hooks]]` tables of a policy file and which of them are in force (tiers, trust);
programs/resolve.py: what each hook runs, found once at the start outside every place the box writes;
run.py: one hook run as a host process (bounded, scrubbed, killed at its timeout);
engine.py: the hook points, their verdicts and the transcript's `hook` events.
"""
