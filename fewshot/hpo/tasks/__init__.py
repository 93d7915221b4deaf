"""The HPO tasks of the paper, each a bilevel problem handed to `fewshot.hpo.optimize`.

- `base`: the task contract (`Task`, the shared settings `TaskSettings` / `HpoSettings`); each
  task module defines its `TASK`, registered in `fewshot.hpo.cli.TASKS`.

- `regularization`: lasso / ridge / logistic / SVM regularization on LIBSVM data.
- `cleaning` (+ `cleaning_data`): data hyper-cleaning on MNIST / Fashion-MNIST.
- `image_regularization`: per-parameter L2 weights of softmax regression and an MLP.
- `classifiers`, `image_data`: the image classifiers and image sets the two image tasks share.
- `ridge`: ridge regression's closed-form inner solution and hypergradient (the ground truth).
- `bias_variance`: the hypergradient's bias^2 and variance as U grows (paper Section 5).
- `ground_truth`: exact lasso and SVM hyperparameter paths from cvxpy inner solutions.

Every loss is a pure function of (theta, lam, batch); batches are drawn by the estimators.
"""
