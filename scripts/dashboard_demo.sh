#!/usr/bin/env bash
# The dashboards end to end on the mini target, small (about 5 min on 2 cores): 5 drafters' eval runs, a 2x2 α/β sweep, one training run,
# all logging to W&B offline; then task=report and task=dashboard over them.
set -x
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline
D=${1:-runs/dashboard_demo}
PY=.venv/bin/python
C="target=smollm2_135m benchmark=gsm8k eval.num_samples=1 eval.max_new_tokens=32 logger=wandb cpu_threads=1"
for d in dflash dels_rnn dels_markov; do $PY -m specexp drafter=$d $C hydra.run.dir=$D/eval/$d; done
$PY -m specexp drafter=domino_ft drafter.head.init=random $C hydra.run.dir=$D/eval/domino_ft_random
$PY -m specexp drafter=dedit drafter.init=random $C hydra.run.dir=$D/eval/dedit_random
$PY -m specexp -m drafter=dels_rnn fusion.alpha=0.0,0.6 fusion.beta=0.0,0.6 $C hydra.sweep.dir=$D/dels_alpha_beta
$PY -m specexp task=train target=smollm2_135m drafter=dels_rnn data=smoke train=smoke train.eval_after=false \
    drafter.head.train.epochs=6 train.log_every=2 logger=wandb cpu_threads=1 hydra.run.dir=$D/train/dels_rnn
$PY -m specexp task=report "report.runs=[$D/eval/dflash,$D/eval/dels_rnn,$D/eval/dels_markov,'domino_ft (random head)=$D/eval/domino_ft_random','dedit (random)=$D/eval/dedit_random',$D/dels_alpha_beta,$D/train/dels_rnn]" hydra.run.dir=$D/report
$PY -m specexp task=dashboard dashboard.sweep_group=dels_alpha_beta hydra.run.dir=$D/dashboard
find $D -path "*wandb/offline-run-*" -maxdepth 6 -type d -name "offline-run-*"
