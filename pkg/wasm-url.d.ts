// `import wasmUrl from "hostlease/hostlease_bg.wasm"`: the bundler's URL of the `.wasm`
// (esbuild's `--loader:.wasm=file`, webpack's asset modules), to pass to `init(wasmUrl)`.
declare const wasmUrl: string;
export default wasmUrl;
