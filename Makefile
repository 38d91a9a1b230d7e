# Two commands for a fresh clone: each sets up what is missing (.ci/setup.sh), then runs its job.
#   make example   trains the Fashion-MNIST example (make example ARGS="--epochs 2" passes it arguments)
#   make test      the linter and the suite, newest and oldest versions: what CI runs (.ci/run)
#   make test-full the same with the full tier's layouts (TRAINER_TESTS=full): more replica counts, workers, scale
#   make notebook  runs notebooks/quickstart.ipynb and keeps it with its outputs
.PHONY: example test test-full notebook

example:
	@bash .ci/example $(ARGS)

test:
	@bash .ci/test

test-full:
	@TRAINER_TESTS=full bash .ci/test

notebook:
	@bash .ci/notebook
