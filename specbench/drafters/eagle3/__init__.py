"""EAGLE-3: the autoregressive feature-level draft head (`head`) and its drafter (`drafter`)."""
