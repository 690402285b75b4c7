"""One Ray actor class per role (generator, verifier, learner) and the code each hosts."""
