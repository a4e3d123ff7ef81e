"""tff_partial: partial-model federated learning building blocks for TFF."""
