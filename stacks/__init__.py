"""One file per stack. Stacks compose constructs and wire them; they hold no resource details."""
