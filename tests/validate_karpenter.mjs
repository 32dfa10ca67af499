// Validates Karpenter objects (JSON array on stdin) with the @kubernetes-models/karpenter registry
// package; prints one JSON line per object: {"kind", "name", "error"}.
import { readFileSync } from "node:fs";
import { NodePool } from "@kubernetes-models/karpenter/karpenter.sh/v1/NodePool";
import { EC2NodeClass } from "@kubernetes-models/karpenter/karpenter.k8s.aws/v1/EC2NodeClass";

const models = { NodePool, EC2NodeClass };
for (const object of JSON.parse(readFileSync(0, "utf8"))) {
  const Model = models[object.kind];
  let error = Model ? null : `no model for kind ${object.kind}`;
  if (Model) {
    try {
      new Model(object).validate();
    } catch (e) {
      error = e.message;
    }
  }
  console.log(JSON.stringify({ kind: object.kind, name: object.metadata?.name, error }));
}
