// Validates custom resources (JSON array on stdin) against their CRDs' schemas, from the
// @kubernetes-models packages (generated from each project's CRDs). Prints one line per
// object; exits 1 if any is invalid, 2 if a kind is unknown here.
const { ScaledObject } = require("@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject");

const MODELS = { "keda.sh/v1alpha1/ScaledObject": ScaledObject };
const objects = JSON.parse(require("fs").readFileSync(0, "utf8"));
let invalid = 0;
for (const obj of objects) {
  const Model = MODELS[`${obj.apiVersion}/${obj.kind}`];
  if (!Model) {
    console.log(`unknown ${obj.apiVersion}/${obj.kind}`);
    process.exit(2);
  }
  try {
    new Model(obj).validate();
    console.log(`valid ${obj.kind} ${obj.metadata.name}`);
  } catch (e) {
    invalid++;
    console.log(`invalid ${obj.kind} ${obj.metadata.name}: ${e.message}`);
  }
}
process.exit(invalid ? 1 : 0);
